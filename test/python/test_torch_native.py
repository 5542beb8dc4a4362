"""expanse.torch.use()'s choice between the native allocator and the pluggable pair, against
stand-ins for torch and torch.utils.cpp_extension (no PyTorch needed): what it builds with, when it
falls back and what the fallback's warning names."""
import os
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


@pytest.fixture
def native_torch(monkeypatch, ex, tmp_path):
    import expanse.torch as et
    monkeypatch.setattr(et, "_allocator", None)
    fake = FakeTorch()
    fake.module.__version__ = "2.99.0+fake"
    fake.module.__file__ = str(tmp_path / "torch" / "__init__.py")
    cuda = tmp_path / "cuda"  # a stand-in toolkit: only the header the build looks for
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda_runtime_api.h").write_text("")
    ext = FakeCppExtension(cuda_home=str(cuda))
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
    assert [os.path.basename(s) for s in args["sources"]] == ["torch_allocator.cpp",
                                                             "torch_adapter.cpp"]
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


def test_no_cuda_headers_is_named(native_torch):
    fake, ext, et = native_torch
    ext.module.CUDA_HOME = "/nonexistent/cuda"
    import importlib.util
    try:
        wheel = importlib.util.find_spec("nvidia") is not None
    except ImportError:
        wheel = False
    if wheel:
        pytest.skip("nvidia wheels are installed here: their headers may do")
    with pytest.raises(et.NativeUnavailable, match="no CUDA runtime headers"):
        et.native_build_args(fake.module, ext.module)


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
