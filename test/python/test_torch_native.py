"""expanse.torch.use()'s choice between the native allocator and the pluggable pair, against
stand-ins for torch and torch.utils.cpp_extension (no PyTorch needed): what it builds with, when it
falls back and what the fallback's warning names."""
import logging
import os
import shutil
import sys
import types

import pytest

import expanse
from conftest import SIM
from test_torch import FakeTorch


class FakeCppExtension:
    def __init__(self, ninja=True, cuda_home=None, fail=None):
        self.module = types.ModuleType("torch.utils.cpp_extension")
        self.module.is_ninja_available = lambda: ninja
        self.module.CUDA_HOME = cuda_home
        self.loads = []

        def load(**kwargs):
            self.loads.append(kwargs)
            if fail:
                raise RuntimeError(fail)

        self.module.load = load


def write_headers(include, names, cudart_version=None):
    """Empty stand-ins for the headers `names` under `include`; cuda_runtime_api.h says
    CUDART_VERSION where given, as the real one does."""
    for name in names:
        f = include / name
        f.parent.mkdir(parents=True, exist_ok=True)
        text = ""
        if name == "cuda_runtime_api.h" and cudart_version is not None:
            text = f"#define CUDART_VERSION  {cudart_version}\n"
        f.write_text(text)
    return include


def fake_toolkit(home, cudart_version=13000):
    """A stand-in CUDA toolkit at `home`: every header the native allocator's compile reads."""
    import expanse.torch as et
    write_headers(home / "include", et.CUDA_HEADERS, cudart_version)
    return home


@pytest.fixture
def native_torch(monkeypatch, ex, tmp_path):
    import expanse.torch as et
    monkeypatch.setattr(et, "_allocator", None)
    fake = FakeTorch()
    fake.module.__version__ = "2.99.0+fake"
    fake.module.__file__ = str(tmp_path / "torch" / "__init__.py")
    cuda = fake_toolkit(tmp_path / "cuda")
    ext = FakeCppExtension(cuda_home=str(cuda))
    # Only the CUDA headers a test lays out are candidates: none of this machine's (its nvidia
    # wheels, CUDA_HOME, nvcc, /usr/local/cuda). The wheels are still found through sys.path.
    found = et._nvidia_roots
    monkeypatch.setattr(et, "_nvidia_roots",
                        lambda: [r for r in found() if r.startswith(str(tmp_path) + os.sep)])
    monkeypatch.setattr(et, "_DEFAULT_CUDA_HOMES", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    (tmp_path / "empty-bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = ext.module
    fake.module.utils = utils
    for name, mod in dict(fake.modules, **{"torch.utils": utils,
                                           "torch.utils.cpp_extension": ext.module}).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("EXPANSE_TORCH_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("CXX", sys.executable)  # any program on PATH passes the compiler check
    return fake, ext, et


def test_build_args_compile_the_native_sources_against_this_library(native_torch):
    fake, ext, et = native_torch
    args = et.native_build_args(fake.module, ext.module)
    assert args["name"] == et.NATIVE_NAME
    assert [os.path.basename(s) for s in args["sources"]] == [
        "torch_allocator.cpp", "torch_adapter.cpp", "torch_host_allocator.cpp"]
    assert all(os.path.isfile(s) for s in args["sources"])
    assert any(os.path.isfile(os.path.join(d, "expanse", "expanse.h"))
               for d in args["extra_include_paths"])
    lib = os.path.realpath(expanse.library_path())
    assert lib in args["extra_ldflags"]
    assert "-Wl,-rpath," + os.path.dirname(lib) in args["extra_ldflags"]
    assert args["is_python_module"] is False
    # PyTorch's own CUDA runtime, through libtorch_cuda; never a toolkit's libcudart.
    assert args["with_cuda"] is False
    assert "-ltorch_cuda" in args["extra_ldflags"]
    assert "-ltorch_cpu" in args["extra_ldflags"]  # the host allocator's registry
    assert not any("cudart" in f for f in args["extra_ldflags"])
    assert args["build_directory"] == os.environ["EXPANSE_TORCH_BUILD_DIR"]


def test_build_cache_is_per_torch_version_and_library(native_torch, monkeypatch):
    fake, ext, et = native_torch
    monkeypatch.delenv("EXPANSE_TORCH_BUILD_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/cache")
    a = et.native_build_args(fake.module, ext.module)["build_directory"]
    fake.module.__version__ = "2.98.0"
    b = et.native_build_args(fake.module, ext.module)["build_directory"]
    assert a.startswith("/cache/expanse/torch_native/2.99.0+fake-")
    assert b.startswith("/cache/expanse/torch_native/2.98.0-") and a != b


def test_no_compiler_falls_back_to_the_pluggable_pair_naming_what_is_lost(native_torch,
                                                                          monkeypatch):
    fake, ext, et = native_torch
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.warns(RuntimeWarning) as w:
        alloc = et.use(SIM)
    msg = str(w[0].message)
    assert "no C++ compiler found" in msg
    for lost in ("torch.cuda.memory_stats()", "cudnn.benchmark", "record_stream",
                 "OutOfMemoryError", "native=False"):
        assert lost in msg, lost
    assert fake.calls[0][0] == "CUDAPluggableAllocator"
    assert fake.calls[1] == ("change", alloc)
    assert et.in_use() and not et.native_in_use()
    assert ext.loads == []


def test_native_true_raises_instead_of_falling_back(native_torch):
    fake, ext, et = native_torch
    ext.module.is_ninja_available = lambda: False
    with pytest.raises(et.NativeUnavailable, match="ninja"):
        et.use(SIM, native=True)
    assert fake.calls == [] and not et.in_use()


def test_a_failed_build_falls_back_with_the_compilers_words(native_torch):
    fake, ext, et = native_torch
    ext.module.load = lambda **kw: (_ for _ in ()).throw(RuntimeError("error: no member named x"))
    with pytest.warns(RuntimeWarning, match="no member named x"):
        et.use(SIM)
    assert fake.calls[0][0] == "CUDAPluggableAllocator"


def test_native_false_uses_the_pluggable_pair_without_a_warning(native_torch, recwarn):
    fake, ext, et = native_torch
    et.use(SIM, native=False)
    assert fake.calls[0][0] == "CUDAPluggableAllocator"
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert ext.loads == []


def test_missing_sources_are_named(native_torch, monkeypatch, tmp_path):
    fake, ext, et = native_torch
    monkeypatch.setattr(et, "_NATIVE_DIR", str(tmp_path / "no-native"))
    with pytest.raises(et.NativeUnavailable, match="sources are not installed"):
        et.native_build_args(fake.module, ext.module)


def test_build_cache_follows_the_sources_content(native_torch, monkeypatch, tmp_path):
    # A reinstall can bring new sources with older times than the cached build (a package
    # manager's cache hard-links files extracted earlier): ninja, which compares times, would
    # then keep the old library. The cache folder itself must change with what is compiled.
    import shutil
    fake, ext, et = native_torch
    monkeypatch.delenv("EXPANSE_TORCH_BUILD_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/cache")
    native = tmp_path / "native"
    shutil.copytree(et._NATIVE_DIR, native)
    monkeypatch.setattr(et, "_NATIVE_DIR", str(native))
    a = et.native_build_args(fake.module, ext.module)["build_directory"]
    for name in ("torch_allocator.cpp", "torch_adapter.hpp"):
        f = native / name
        st = os.stat(f)
        f.write_text(f.read_text() + "\n// changed\n")
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same time, new content
        b = et.native_build_args(fake.module, ext.module)["build_directory"]
        assert b != a, name
        a = b


def test_native_allocator_announces_graph_captures(native_torch, monkeypatch):
    # The native allocator routes a capture to its pool; the announcement (so that expanse never
    # synchronizes the context under the capture) comes from the same wrapper as the pluggable
    # pair's, around torch.cuda.CUDAGraph.capture_begin / capture_end.
    fake, ext, et = native_torch
    monkeypatch.setattr(et, "_install_native", lambda torch: et.NativeAllocator("/x.so"))
    monkeypatch.setattr(expanse, "capture_begin",
                        lambda s=None: fake.calls.append(("announce", s.cuda_stream)))
    monkeypatch.setattr(expanse, "capture_end",
                        lambda s=None: fake.calls.append(("unannounce", s.cuda_stream)))
    assert isinstance(et.use(), et.NativeAllocator)
    assert et.native_in_use()
    fake.calls.clear()
    g = fake.module.cuda.CUDAGraph()
    g.capture_begin()
    g.capture_end()
    assert [c[0] for c in fake.calls] == ["announce", "capture_begin", "capture_end", "unannounce"]


# ---- which CUDA headers the native allocator compiles against ----------------------------------

# nvidia/cu13/include of the nvidia-cuda-runtime 13.0.96 wheel, the one torch 2.11.0 (CUDA 13.0)
# depends on: cuda_runtime.h is there, and host_config.h (a shim that includes
# crt/host_config.h), but no crt/ folder.
CU13_RUNTIME_WHEEL = """
builtin_types.h channel_descriptor.h common_functions.h cooperative_groups.h
cooperative_groups/details/async.h cooperative_groups/details/coalesced_reduce.h
cooperative_groups/details/coalesced_scan.h cooperative_groups/details/driver_abi.h
cooperative_groups/details/functional.h cooperative_groups/details/helpers.h
cooperative_groups/details/info.h cooperative_groups/details/invoke.h
cooperative_groups/details/memory.h cooperative_groups/details/partitioning.h
cooperative_groups/details/reduce.h cooperative_groups/details/scan.h
cooperative_groups/details/sync.h cooperative_groups/memcpy_async.h
cooperative_groups/reduce.h cooperative_groups/scan.h cuComplex.h cuda.h cudaEGL.h
cudaEGLTypedefs.h cudaGL.h cudaGLTypedefs.h cudaProfilerTypedefs.h cudaTypedefs.h cudaVDPAU.h
cudaVDPAUTypedefs.h cuda_awbarrier.h cuda_awbarrier_helpers.h cuda_awbarrier_primitives.h
cuda_bf16.h cuda_bf16.hpp cuda_device_runtime_api.h cuda_egl_interop.h cuda_fp16.h
cuda_fp16.hpp cuda_fp4.h cuda_fp4.hpp cuda_fp6.h cuda_fp6.hpp cuda_fp8.h cuda_fp8.hpp
cuda_gl_interop.h cuda_occupancy.h cuda_pipeline.h cuda_pipeline_helpers.h
cuda_pipeline_primitives.h cuda_runtime.h cuda_runtime_api.h cuda_vdpau_interop.h
cudart_platform.h device_atomic_functions.h device_atomic_functions.hpp
device_double_functions.h device_functions.h device_launch_parameters.h device_types.h
driver_functions.h driver_types.h host_config.h host_defines.h library_types.h
math_constants.h math_functions.h mma.h sm_20_atomic_functions.h sm_20_atomic_functions.hpp
sm_20_intrinsics.h sm_20_intrinsics.hpp sm_30_intrinsics.h sm_30_intrinsics.hpp
sm_32_atomic_functions.h sm_32_atomic_functions.hpp sm_32_intrinsics.h sm_32_intrinsics.hpp
sm_35_atomic_functions.h sm_35_intrinsics.h sm_60_atomic_functions.h
sm_60_atomic_functions.hpp sm_61_intrinsics.h sm_61_intrinsics.hpp
surface_indirect_functions.h surface_types.h texture_indirect_functions.h texture_types.h
vector_functions.h vector_functions.hpp vector_types.h
""".split()
# What the nvidia-cuda-crt 13.0.88 wheel adds to the same folder.
CU13_CRT_WHEEL = ["crt/" + n for n in """
common_functions.h cuda_tile.h cudacc_ext.h device_double_functions.h
device_double_functions.hpp device_fp128_functions.h device_functions.h device_functions.hpp
func_macro.h host_config.h host_defines.h host_runtime.h math_functions.h math_functions.hpp
mma.h mma.hpp sm_100_rt.h sm_100_rt.hpp sm_70_rt.h sm_70_rt.hpp sm_80_rt.h sm_80_rt.hpp
sm_90_rt.h sm_90_rt.hpp storage_class.h
""".split()]


def site_packages(tmp_path, monkeypatch):
    """A site-packages on sys.path; returns its nvidia folder (a namespace package, as the
    nvidia wheels install it)."""
    site = tmp_path / "site-packages"
    (site / "nvidia").mkdir(parents=True, exist_ok=True)
    monkeypatch.syspath_prepend(str(site))
    return site / "nvidia"


def cu13_site_packages(tmp_path, monkeypatch, crt=False):
    """A site-packages with torch 2.11.0's CUDA runtime wheel (and nvidia-cuda-crt's files where
    crt); returns its nvidia/cu13/include."""
    nvidia = site_packages(tmp_path, monkeypatch)
    include = write_headers(nvidia / "cu13" / "include", CU13_RUNTIME_WHEEL, 13000)
    if crt:
        write_headers(include, CU13_CRT_WHEEL)
    return include


def test_torch_wheel_without_crt_headers_is_refused_for_cuda_home(native_torch, monkeypatch,
                                                                  tmp_path, caplog):
    # pip's torch 2.11.0+cu130 brings nvidia/cu13/include without crt/host_config.h, which
    # cuda_runtime.h includes: the toolkit's headers must be chosen instead, and why said.
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="13.0")
    wheel = cu13_site_packages(tmp_path, monkeypatch)
    toolkit = str(tmp_path / "cuda" / "include")
    headers = et.choose_cuda_headers(fake.module, ext.module)
    assert headers.folders == [toolkit]
    assert headers.source == "torch.utils.cpp_extension.CUDA_HOME"
    assert headers.version == (13, 0)
    [(source, folders, why)] = headers.refused
    assert folders == [str(wheel)] and "nvidia/cu13" in source
    assert "crt/host_config.h" in why and "missing" in why

    caplog.set_level(logging.INFO, logger="expanse.torch")
    args = et.native_build_args(fake.module, ext.module)
    assert toolkit in args["extra_include_paths"]
    assert str(wheel) not in args["extra_include_paths"]
    [record] = [r for r in caplog.records if r.name == "expanse.torch"]
    assert record.levelno == logging.WARNING  # a build that compiles, after a refusal
    text = record.getMessage()
    assert toolkit in text and str(wheel) in text and "crt/host_config.h" in text


def test_a_complete_torch_wheel_is_chosen(native_torch, monkeypatch, tmp_path, caplog):
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="13.0")
    wheel = cu13_site_packages(tmp_path, monkeypatch, crt=True)
    headers = et.choose_cuda_headers(fake.module, ext.module)
    assert headers.folders == [str(wheel)] and headers.refused == []
    assert "nvidia/cu13" in headers.source
    caplog.set_level(logging.INFO, logger="expanse.torch")
    args = et.native_build_args(fake.module, ext.module)
    assert str(wheel) in args["extra_include_paths"]
    assert str(tmp_path / "cuda" / "include") not in args["extra_include_paths"]
    assert [r.levelno for r in caplog.records if r.name == "expanse.torch"] == [logging.INFO]


def test_no_usable_headers_names_the_missing_file_the_folders_and_what_to_install(
        native_torch, monkeypatch, tmp_path):
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="13.0")
    wheel = cu13_site_packages(tmp_path, monkeypatch)
    ext.module.CUDA_HOME = None
    monkeypatch.setenv("CUDA_HOME", "/nonexistent/cuda")
    with pytest.raises(et.NativeUnavailable) as e:
        et.native_build_args(fake.module, ext.module)
    msg = str(e.value)
    assert "no usable CUDA runtime headers" in msg
    assert f"({wheel}): crt/host_config.h" in msg
    assert "CUDA_HOME=/nonexistent/cuda (/nonexistent/cuda/include): no such folder" in msg
    assert 'pip install "nvidia-cuda-crt==13.0.*"' in msg
    assert "nvidia-cuda-runtime==" not in msg  # the wheel has the runtime's headers
    assert "CUDA 13.0 toolkit" in msg

    # use() falls back with the same words, and builds nothing.
    with pytest.warns(RuntimeWarning) as w:
        et.use(SIM)
    assert 'pip install "nvidia-cuda-crt==13.0.*"' in str(w[0].message)
    assert fake.calls[0][0] == "CUDAPluggableAllocator" and ext.loads == []


def test_no_wheels_and_no_toolkit_asks_for_both_wheels_or_the_toolkit(native_torch):
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="13.0")
    ext.module.CUDA_HOME = None
    with pytest.raises(et.NativeUnavailable) as e:
        et.choose_cuda_headers(fake.module, ext.module)
    msg = str(e.value)
    assert "the nvidia wheels (no folder): no nvidia package is importable" in msg
    assert 'pip install "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"' in msg
    assert "CUDA 13.0 toolkit" in msg


def test_headers_of_another_cuda_major_version_are_refused(native_torch, monkeypatch, tmp_path):
    # torch's headers lay out classes by CUDA_VERSION: CUDA 12 headers under a CUDA 13 torch
    # would compile against classes that torch does not have.
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="13.0")
    old = fake_toolkit(tmp_path / "cuda-12.8", cudart_version=12080)
    monkeypatch.setenv("CUDA_HOME", str(old))
    headers = et.choose_cuda_headers(fake.module, ext.module)
    assert headers.folders == [str(tmp_path / "cuda" / "include")]
    [(source, _, why)] = [r for r in headers.refused if r[0].startswith("CUDA_HOME")]
    assert why == "CUDA 12.8 headers, but torch is built with CUDA 13.0"
    # A minor version apart is accepted (CUDA's minor version compatibility).
    fake.module.version = types.SimpleNamespace(cuda="12.6")
    assert et.choose_cuda_headers(fake.module, ext.module).folders == [str(old / "include")]


def test_cuda12_wheels_combine_the_runtime_and_the_nvcc_wheel(native_torch, monkeypatch,
                                                              tmp_path):
    # CUDA 12's wheels keep crt/ in nvidia/cuda_nvcc/include (nvidia-cuda-nvcc-cu12).
    fake, ext, et = native_torch
    fake.module.version = types.SimpleNamespace(cuda="12.8")
    ext.module.CUDA_HOME = None
    nvidia = site_packages(tmp_path, monkeypatch)
    runtime = write_headers(nvidia / "cuda_runtime" / "include",
                            [h for h in et.CUDA_HEADERS if not h.startswith("crt/")], 12080)
    with pytest.raises(et.NativeUnavailable) as e:
        et.choose_cuda_headers(fake.module, ext.module)
    assert "crt/host_config.h, crt/host_defines.h missing" in str(e.value)
    assert 'pip install "nvidia-cuda-nvcc-cu12==12.8.*"' in str(e.value)
    nvcc = write_headers(nvidia / "cuda_nvcc" / "include",
                         [h for h in et.CUDA_HEADERS if h.startswith("crt/")])
    headers = et.choose_cuda_headers(fake.module, ext.module)
    assert headers.folders == [str(runtime), str(nvcc)] and headers.version == (12, 8)
    args = et.native_build_args(fake.module, ext.module)
    assert args["extra_include_paths"][-2:] == [str(runtime), str(nvcc)]


def test_toolkits_are_tried_in_order(native_torch, monkeypatch, tmp_path):
    # CUDA_HOME, then torch's idea of it, then the nvcc on PATH, then /usr/local/cuda.
    fake, ext, et = native_torch
    env_home = fake_toolkit(tmp_path / "env-cuda")
    nvcc_home = fake_toolkit(tmp_path / "nvcc-cuda")
    (nvcc_home / "bin").mkdir()
    (nvcc_home / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (nvcc_home / "bin" / "nvcc").chmod(0o755)
    default_home = fake_toolkit(tmp_path / "default-cuda")
    monkeypatch.setattr(et, "_DEFAULT_CUDA_HOMES", (str(default_home),))
    monkeypatch.setenv("PATH", str(nvcc_home / "bin"))
    monkeypatch.setenv("CUDA_HOME", str(env_home))

    def chosen():
        h = et.choose_cuda_headers(fake.module, ext.module)
        return h.source, h.folders

    assert chosen() == (f"CUDA_HOME={env_home}", [str(env_home / "include")])
    monkeypatch.delenv("CUDA_HOME")
    assert chosen() == ("torch.utils.cpp_extension.CUDA_HOME", [str(tmp_path / "cuda" / "include")])
    ext.module.CUDA_HOME = None
    assert chosen() == (f"nvcc on PATH ({nvcc_home / 'bin' / 'nvcc'})",
                        [str(nvcc_home / "include")])
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert chosen() == (str(default_home), [str(default_home / "include")])


def test_cuda_headers_are_what_the_compiler_reads():
    # CUDA_HEADERS must hold every file the compile reads from the CUDA headers (else a folder
    # lacking one is chosen and the compile fails) and nothing a toolkit lacks (else a complete
    # one is refused). torch's c10/cuda headers include these three.
    import subprocess
    import expanse.torch as et
    cxx = shutil.which("c++") or shutil.which("g++")
    homes = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    include = next((os.path.join(h, "include") for h in homes
                    if h and os.path.isfile(os.path.join(h, "include", "cuda_runtime.h"))), None)
    if cxx is None or include is None:
        pytest.skip("needs a C++ compiler and a CUDA toolkit (CUDA_HOME or /usr/local/cuda)")
    include = os.path.realpath(include)
    src = "#include <cuda_runtime_api.h>\n#include <cuda_runtime.h>\n#include <cuda.h>\n"
    out = subprocess.run([cxx, "-M", "-x", "c++", "-I", include, "-"], input=src, text=True,
                         capture_output=True, check=True).stdout
    read = {os.path.relpath(os.path.realpath(p), include)
            for p in out.replace("\\\n", " ").split()[1:]
            if os.path.realpath(p).startswith(include + os.sep)}
    assert "crt/host_config.h" in read
    assert read <= set(et.CUDA_HEADERS), sorted(read - set(et.CUDA_HEADERS))
    assert [h for h in et.CUDA_HEADERS if not os.path.isfile(os.path.join(include, h))] == []


class FakeHostExtension:
    """The native extension's host entry points, answering as told."""

    def __init__(self, rc, error=b""):
        self.rc, self.error, self.installs = rc, error, 0

    def expanse_torch_native_install_host(self):
        self.installs += 1
        return self.rc

    def expanse_torch_native_host_error(self):
        return self.error

    def expanse_torch_native_host_installed(self):
        return 1 if self.rc == 0 and self.installs else 0


@pytest.mark.parametrize("rc,raised", [(0, None), (2, "NativeUnavailable"), (1, "RuntimeError")])
def test_use_host_installs_or_says_why_not(native_torch, monkeypatch, rc, raised):
    import expanse.torch as et
    ext = FakeHostExtension(rc, b"the reason")
    monkeypatch.setattr(et, "_load_native", lambda torch: ("/fake.so", ext))
    monkeypatch.setattr(et, "_native_ext", ("/fake.so", ext))
    if raised is None:
        et.use_host()
        assert et.host_in_use()
    else:
        with pytest.raises(getattr(et, raised) if hasattr(et, raised) else RuntimeError,
                           match="the reason"):
            et.use_host()
        assert not et.host_in_use()
    assert ext.installs == 1


def test_use_host_on_the_installed_torch(ex):
    """With a real PyTorch (2.8 or newer) and a compiler: expanse becomes its CUDA host
    allocator (the allocation itself needs a GPU: test/gpu/torch_native_checks.py)."""
    pytest.importorskip("torch")
    import expanse.torch as et
    try:
        et.use_host()
    except et.NativeUnavailable as e:
        pytest.skip(f"the native extension cannot be built or installed here: {e}")
    assert et.host_in_use()


def test_use_with_host_installs_the_host_allocator_too(native_torch, monkeypatch):
    import expanse.torch as et
    ext = FakeHostExtension(0)
    monkeypatch.setattr(et, "_load_native", lambda torch: ("/fake.so", ext))
    monkeypatch.setattr(et, "_native_ext", ("/fake.so", ext))
    monkeypatch.setattr(et, "_install_native", lambda torch: et.NativeAllocator("/fake.so"))
    et.use(host=True)
    assert ext.installs == 1 and et.host_in_use()
