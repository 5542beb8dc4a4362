"""expanse as PyTorch's CUDA allocator.

    import expanse.torch
    expanse.torch.use()          # before the first CUDA tensor
    x = torch.empty(..., device="cuda")   # allocated by expanse

use() makes expanse PyTorch's own allocator (native: a C++ CUDAAllocator compiled against the
installed torch at first use, then cached): torch.cuda.memory_stats(), memory_snapshot(),
_record_memory_history(), empty_cache(), set_per_process_memory_fraction(),
torch.backends.cudnn.benchmark (cacheInfo) and Tensor.record_stream answer from expanse's books,
and an OOM raises torch.cuda.OutOfMemoryError. CUDA graphs (torch.cuda.graph,
make_graphed_callables, graph_pool_handle()) and torch.cuda.MemPool / use_mem_pool get expanse
pools, and each torch.cuda.graph capture is announced to expanse (see expanse.capture_begin). Not
supported: torch.compile's CUDA graph trees (mode="reduce-overhead" needs
torch._inductor.config.triton.cudagraph_trees = False) and sharing CUDA tensors between
processes.

expanse.torch.use_host() makes expanse PyTorch's CUDA host allocator as well (PyTorch 2.8 and
newer, the same native extension): torch.empty(..., pin_memory=True), Tensor.pin_memory() and
DataLoader(pin_memory=True) get exact pinned memory from expanse.host's pools instead of PyTorch's
power-of-two rounding. expanse.host.empty() gives such tensors with any PyTorch.

Where the native allocator cannot be built (no C++ compiler, no ninja, no usable CUDA headers:
see choose_cuda_headers), use() falls back, with a warning naming what is lost, to the pluggable
pair (CUDAPluggableAllocator with expanse_torch_malloc / expanse_torch_free): an OOM is then a
RuntimeError("CUDA out of memory. Tried to allocate ..."), torch.cuda.memory_stats() and friends
are not supported (the expanse module has them: expanse.memory_stats(), ...), and
torch.cuda.graph captures are announced to expanse (see expanse.capture_begin), so that no
expanse call from another thread invalidates them.
"""
import ctypes
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import threading
import warnings

import expanse as _expanse

MALLOC = "expanse_torch_malloc"
FREE = "expanse_torch_free"

_log = logging.getLogger("expanse.torch")

_allocator = None
# Held through the whole of use(): PyTorch takes one allocator, once, so a second caller waits for
# the first and gets what it installed.
_use_lock = threading.Lock()


# What the pluggable pair does not give a PyTorch user (the fallback's warning names it).
PLUGGABLE_LOSES = ("torch.cuda.memory_stats() / memory_snapshot() / _record_memory_history() "
                   "(use expanse.memory_stats() / expanse.dump_snapshot()), "
                   "torch.backends.cudnn.benchmark (cacheInfo raises), "
                   "Tensor.record_stream (a no-op: memory may be reused under other streams' work), "
                   "torch.cuda.OutOfMemoryError (an OOM is a RuntimeError)")

NATIVE_NAME = "expanse_torch_native"
_NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
_NATIVE_SOURCES = ("torch_allocator.cpp", "torch_adapter.cpp", "torch_host_allocator.cpp")


class NativeUnavailable(RuntimeError):
    """The native allocator cannot be built here; the message says what is missing."""


class NativeAllocator:
    """What use() returns when expanse is PyTorch's native allocator."""

    def __init__(self, extension):
        self.extension = extension  # the compiled module's path

    def __repr__(self):
        return f"<expanse native PyTorch allocator {self.extension}>"


def _reserve_conf(conf, reserve):
    """conf (None: EXPANSE_CONF) with the key reserve:<reserve> added."""
    if isinstance(reserve, bool):
        raise TypeError("expanse.torch.use(reserve=...): expected bytes, a fraction or \"free\"")
    if isinstance(reserve, float):
        if not 0.0 < reserve <= 1.0:
            raise ValueError(f"expanse.torch.use: reserve fraction {reserve} is not in (0, 1]")
        spec = repr(reserve)
    elif isinstance(reserve, int):
        spec = str(reserve)
    elif isinstance(reserve, str):
        spec = reserve
    else:
        raise TypeError("expanse.torch.use(reserve=...): expected bytes, a fraction or \"free\", "
                        f"got {reserve!r}")
    base = conf if conf is not None else os.environ.get("EXPANSE_CONF", "")
    return ",".join(x for x in (base, "reserve:" + spec) if x)


def use(conf=None, native=None, reserve=None, host=False):
    """Makes expanse PyTorch's CUDA allocator. conf: an EXPANSE_CONF-style string applied first
    (None: EXPANSE_CONF). native: None (default) = the native allocator, or the pluggable pair
    with a warning where it cannot be built; True = the native allocator or an error saying why
    not; False = the pluggable pair. Must run before PyTorch allocates CUDA memory; raises
    RuntimeError otherwise. Calling it again once in use does nothing (and fails if conf would
    change the configuration). Returns the allocator object (NativeAllocator, or PyTorch's
    CUDAPluggableAllocator). Thread-safe: callers racing each other install once and all get that
    allocator. reserve: hold that much physical memory on every device from its first use
    (EXPANSE_CONF reserve: bytes, a fraction such as 0.9, "free" or a size such as "40GiB");
    expanse.reserve() changes it later. host=True: expanse becomes PyTorch's CUDA host (pinned)
    allocator as well (use_host(); its NativeUnavailable is raised as is)."""
    import torch  # noqa: F401  (ImportError names the missing dependency)

    if reserve is not None:
        conf = _reserve_conf(conf, reserve)

    with _use_lock:
        allocator = _use_locked(torch, conf, native)
    if host:
        use_host()
    return allocator


def _use_locked(torch, conf, native):
    global _allocator
    if _allocator is not None:
        if conf is not None:
            raise RuntimeError("expanse.torch.use(conf): expanse is already PyTorch's allocator; "
                               "the configuration can no longer change")
        return _allocator
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "expanse.torch.use(): PyTorch has already initialized CUDA (and with it its own "
            "caching allocator); PyTorch can switch allocators only before that. Call "
            "expanse.torch.use() before the first CUDA tensor or torch.cuda call that "
            "initializes CUDA.")
    if conf is not None:
        _expanse.init(conf)
    if native is not False:
        try:
            _allocator = _install_native(torch)
            # The native allocator routes a capture's allocations to its pool (beginAllocateToPool
            # comes before the capture begins), but PyTorch calls no allocator hook that tells
            # expanse a capture is coming: the same wrapper announces it.
            _announce_graph_captures(torch)
            return _allocator
        except NativeUnavailable as e:
            if native:
                raise
            warnings.warn(f"expanse.torch.use(): {e}; using the pluggable allocator instead, "
                          f"which loses {PLUGGABLE_LOSES}. expanse.torch.use(native=False) "
                          "chooses it without this warning.", RuntimeWarning, stacklevel=3)
    from torch.cuda import memory as tmem
    path = _expanse.library_path()
    allocator = tmem.CUDAPluggableAllocator(path, MALLOC, FREE)
    tmem.change_current_allocator(allocator)
    _announce_graph_captures(torch)
    _allocator = allocator
    return allocator


def _include_dir():
    """The folder holding expanse/expanse.h: EXPANSE_INCLUDE, a copy inside the package, the
    checkout this package lies in, or next to the library (an installed prefix)."""
    here = os.path.dirname(os.path.abspath(__file__))
    lib_dir = os.path.dirname(_expanse.library_path())
    for cand in (os.environ.get("EXPANSE_INCLUDE"), os.path.join(here, "include"),
                 os.path.join(here, "..", "..", "include"), os.path.join(lib_dir, "..", "include"),
                 os.path.join(lib_dir, "..", "..", "include")):
        if cand and os.path.isfile(os.path.join(cand, "expanse", "expanse.h")):
            return os.path.abspath(cand)
    raise NativeUnavailable("expanse's C header (expanse/expanse.h) was not found next to the "
                            "package or the library; set EXPANSE_INCLUDE to its include folder")


# The CUDA headers the native allocator's compile reads: torch's c10/cuda headers include
# cuda_runtime_api.h, cuda_runtime.h and cuda.h, and those include the rest (what the compiler
# lists, g++ -M, for torch 2.11 against CUDA 13.0 and 12.8: the same files). A folder lacking one
# fails the compile, or worse takes that one header from another CUDA on the compiler's path.
CUDA_HEADERS = ("cuda_runtime_api.h", "cuda_runtime.h", "cuda.h", "crt/host_config.h",
                "crt/host_defines.h", "builtin_types.h", "channel_descriptor.h",
                "cuda_device_runtime_api.h", "device_types.h", "driver_functions.h",
                "driver_types.h", "library_types.h", "surface_types.h", "texture_types.h",
                "vector_functions.h", "vector_functions.hpp", "vector_types.h")

# Toolkit homes tried after CUDA_HOME and nvcc's (tests replace it).
_DEFAULT_CUDA_HOMES = ("/usr/local/cuda",)
# Searched by the compiler anyway: -I would put them ahead of the C++ library's own headers.
_SYSTEM_INCLUDES = ("/usr/include", "/usr/local/include")


class CudaHeaders:
    """The CUDA headers the native allocator compiles against: source (where they come from),
    folders (the include folders, in order), version ((major, minor) read from
    cuda_runtime_api.h, or None) and refused (each candidate tried before, as (source, folders,
    why))."""

    def __init__(self, source, folders, version, refused):
        self.source = source
        self.folders = list(folders)
        self.version = version
        self.refused = list(refused)

    def include_paths(self):
        return [f for f in self.folders if os.path.realpath(f) not in _SYSTEM_INCLUDES]

    def __str__(self):
        cuda = f", CUDA {self.version[0]}.{self.version[1]}" if self.version else ""
        text = f"CUDA headers from {self.source} ({', '.join(self.folders)}{cuda})"
        if self.refused:
            text += "; refused: " + _tried(self.refused)
        return text


def _tried(refused):
    return "; ".join(f"{source} ({', '.join(folders) or 'no folder'}): {why}"
                     for source, folders, why in refused)


def _torch_cuda(torch):
    """torch's CUDA version as (major, minor), or None (a CPU build, or not said)."""
    try:
        major, minor = str(torch.version.cuda).split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, TypeError, ValueError):
        return None


def _nvidia_roots():
    """The folders of the `nvidia` namespace package, where the nvidia wheels put their files."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def _wheel_candidates(cuda, roots):
    """(source, folders) of the nvidia wheels' headers for torch's CUDA (every layout when it is
    not known). CUDA 13 wheels share nvidia/cu13/include; CUDA 12's have the runtime in
    nvidia/cuda_runtime/include and crt/ in nvidia/cuda_nvcc/include (nvidia-cuda-nvcc-cu12)."""
    out = []
    for root in roots:
        if cuda is None:
            try:
                names = sorted((n for n in os.listdir(root) if re.fullmatch(r"cu\d+", n)),
                               key=lambda n: -int(n[2:]))
            except OSError:
                names = []
        else:
            names = [f"cu{cuda[0]}"] if cuda[0] >= 13 else []
        out += [(f"the nvidia wheels (nvidia/{n})", [os.path.join(root, n, "include")])
                for n in names]
        if cuda is None or cuda[0] <= 12:
            out.append(("the nvidia wheels (nvidia/cuda_runtime, nvidia/cuda_nvcc)",
                        [os.path.join(root, d, "include") for d in ("cuda_runtime", "cuda_nvcc")]))
    return out


def _toolkit_candidates(cpp_extension):
    out = [(f"{var}={os.environ[var]}", [os.path.join(os.environ[var], "include")])
           for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    home = getattr(cpp_extension, "CUDA_HOME", None)
    if home:
        out.append(("torch.utils.cpp_extension.CUDA_HOME", [os.path.join(home, "include")]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        out.append((f"nvcc on PATH ({nvcc})", [os.path.join(home, "include")]))
    out += [(home, [os.path.join(home, "include")]) for home in _DEFAULT_CUDA_HOMES]
    return out


def _header_version(folders):
    for folder in folders:
        try:
            with open(os.path.join(folder, "cuda_runtime_api.h"), errors="replace") as f:
                m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
        except OSError:
            continue
        if m:
            v = int(m.group(1))
            return v // 1000, v % 1000 // 10
    return None


def _missing_headers(folders):
    return [h for h in CUDA_HEADERS
            if not any(os.path.isfile(os.path.join(f, h)) for f in folders)]


def _refusal(folders, cuda):
    """Why these folders cannot be compiled against (None: they can)."""
    present = [f for f in folders if os.path.isdir(f)]
    if not present:
        return "no such folder"
    missing = _missing_headers(present)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                          else "")
        return f"{shown} missing"
    version = _header_version(present)
    # torch's own headers lay out classes by CUDA_VERSION: another major version's headers
    # would compile a class torch does not have.
    if cuda is not None and version is not None and version[0] != cuda[0]:
        return (f"CUDA {version[0]}.{version[1]} headers, but torch is built with CUDA "
                f"{cuda[0]}.{cuda[1]}")
    return None


def _install_advice(cuda, wheel_missing):
    """What to install when no candidate is usable. The pip packages are named only for CUDA 12
    and 13, whose names on PyPI were checked."""
    version = f"{cuda[0]}.{cuda[1]}" if cuda else "matching torch's"
    advice = (f"Install the CUDA {version} toolkit (and set CUDA_HOME to it unless it is "
              "/usr/local/cuda or its nvcc is on PATH)")
    if cuda is not None and cuda[0] in (12, 13):
        crt, runtime = (("nvidia-cuda-crt", "nvidia-cuda-runtime") if cuda[0] == 13 else
                        ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-runtime-cu12"))
        missing = wheel_missing if wheel_missing is not None else list(CUDA_HEADERS)
        packages = ([runtime] if any(not h.startswith("crt/") for h in missing) else []) + \
                   ([crt] if any(h.startswith("crt/") for h in missing) else [])
        spec = " ".join(f'"{p}=={cuda[0]}.{cuda[1]}.*"' for p in packages)
        advice += f", or complete the nvidia wheels torch uses: pip install {spec}"
        if crt in packages:
            advice += f" ({crt} brings crt/host_config.h and the rest of crt/)"
    return advice + "."


def choose_cuda_headers(torch, cpp_extension):
    """The CUDA headers to compile the native allocator against, as CudaHeaders: the first
    candidate holding every header of CUDA_HEADERS (and, where both are known, of torch's CUDA
    major version), tried in this order: the nvidia wheels of torch's CUDA (they match the
    runtime torch loads), CUDA_HOME / CUDA_PATH, torch.utils.cpp_extension.CUDA_HOME, the
    toolkit of the nvcc on PATH, /usr/local/cuda. NativeUnavailable names every folder tried,
    what each lacks and what to install."""
    cuda = _torch_cuda(torch)
    refused, seen, wheel_missing = [], set(), None
    roots = _nvidia_roots()
    if not roots:
        refused.append(("the nvidia wheels", [], "no nvidia package is importable"))
    for source, folders in _wheel_candidates(cuda, roots) + _toolkit_candidates(cpp_extension):
        key = tuple(os.path.realpath(f) for f in folders)
        if key in seen:
            continue
        seen.add(key)
        why = _refusal(folders, cuda)
        if why is None:
            present = [f for f in folders if os.path.isdir(f)]
            return CudaHeaders(source, present, _header_version(present), refused)
        refused.append((source, folders, why))
        if wheel_missing is None and source.startswith("the nvidia wheels") and \
                any(os.path.isdir(f) for f in folders):
            wheel_missing = _missing_headers([f for f in folders if os.path.isdir(f)])
    raise NativeUnavailable(
        "no usable CUDA runtime headers (the native allocator's compile reads "
        f"cuda_runtime_api.h, cuda_runtime.h, cuda.h and the headers they include: "
        f"{len(CUDA_HEADERS)} files, expanse.torch.CUDA_HEADERS); tried: {_tried(refused)}. "
        + _install_advice(cuda, wheel_missing))


def native_build_args(torch, cpp_extension):
    """The arguments of torch.utils.cpp_extension.load that build the native allocator, or
    NativeUnavailable naming what this machine lacks."""
    return _native_build(torch, cpp_extension)[0]


def _native_build(torch, cpp_extension):
    """native_build_args' answer and the CudaHeaders it compiles against."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise NativeUnavailable(f"no C++ compiler found (CXX={cxx!r} is not on PATH)")
    if not cpp_extension.is_ninja_available():
        raise NativeUnavailable("torch.utils.cpp_extension needs ninja, which is not installed "
                                "(pip install ninja)")
    lib = os.path.realpath(_expanse.library_path())
    include = _include_dir()
    headers = choose_cuda_headers(torch, cpp_extension)
    sources = [os.path.join(_NATIVE_DIR, f) for f in _NATIVE_SOURCES]
    missing = [f for f in sources + [os.path.join(_NATIVE_DIR, "torch_adapter.hpp"),
                                     os.path.join(_NATIVE_DIR, "torch_version.hpp")]
               if not os.path.isfile(f)]
    if missing:
        raise NativeUnavailable("the native allocator's sources are not installed with this "
                                f"package (missing: {', '.join(missing)})")
    # One build per torch, library, header location and source content: a cached build never
    # mixes them. The content, not only ninja's time stamps: a reinstall may bring new sources
    # older than the cached build (a package manager's cache links files extracted earlier).
    key = hashlib.sha1("\0".join([torch.__version__, lib, include] + headers.folders).encode())
    compiled = sources + [os.path.join(_NATIVE_DIR, "torch_adapter.hpp"),
                          os.path.join(_NATIVE_DIR, "torch_version.hpp"),
                          os.path.join(include, "expanse", "expanse.h"),
                          os.path.join(include, "expanse", "stats_fields.h")]
    for path in compiled:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                key.update(b"\0" + f.read())
    build_dir = os.environ.get("EXPANSE_TORCH_BUILD_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "expanse", "torch_native", f"{torch.__version__}-{key.hexdigest()[:12]}")
    # Said where users see it (a warning) when a folder looked in was refused and this build
    # compiles: a failure then comes with why these headers and not the others.
    compiles = not os.path.isfile(os.path.join(build_dir, NATIVE_NAME + ".so"))
    looked_in = any(folders for _, folders, _ in headers.refused)
    _log.log(logging.WARNING if looked_in and compiles else logging.INFO,
             "expanse.torch: the native allocator %s against %s", "compiles" if compiles
             else "is built", headers)
    # The CUDA runtime is the one PyTorch loaded, reached through libtorch_cuda's own
    # dependencies: linking a toolkit's libcudart could load a second, different one.
    torch_lib = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    ldflags = [lib, "-Wl,-rpath," + os.path.dirname(lib),
               "-L" + torch_lib, "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10"]
    args = dict(name=NATIVE_NAME, sources=sources,
                extra_include_paths=[_NATIVE_DIR, include] + headers.include_paths(),
                extra_cflags=["-O2"],
                extra_ldflags=ldflags, with_cuda=False, build_directory=build_dir,
                is_python_module=False, verbose=os.environ.get("EXPANSE_TORCH_VERBOSE") == "1")
    return args, headers


_native_ext = None  # (path, CDLL): the extension built and loaded once per process
_native_lock = threading.Lock()


def _load_native(torch):
    """The native extension (the CUDA allocator and the host allocator), built against this
    torch on first use and then cached: (path, ctypes.CDLL). Raises NativeUnavailable."""
    global _native_ext
    with _native_lock:
        if _native_ext is not None:
            return _native_ext
        try:
            from torch.utils import cpp_extension
        except ImportError as e:
            raise NativeUnavailable(f"torch.utils.cpp_extension cannot be imported ({e})") from e
        args, headers = _native_build(torch, cpp_extension)
        os.makedirs(args["build_directory"], exist_ok=True)
        try:
            built = cpp_extension.load(**args)
        except Exception as e:  # noqa: BLE001  (compiler and ninja failures come in many types)
            raise NativeUnavailable(f"building the native allocator in "
                                    f"{args['build_directory']} against {headers} failed "
                                    f"({type(e).__name__}: {str(e).strip()[-2000:]})") from e
        # load() returns the library's path for a non-Python module (and loads it already).
        path = built if isinstance(built, str) else os.path.join(args["build_directory"],
                                                                 NATIVE_NAME + ".so")
        ext = ctypes.CDLL(path)
        ext.expanse_torch_native_error.restype = ctypes.c_char_p
        ext.expanse_torch_native_host_error.restype = ctypes.c_char_p
        _native_ext = (path, ext)
        return _native_ext


def _install_native(torch):
    path, ext = _load_native(torch)
    if ext.expanse_torch_native_install() != 0:
        raise RuntimeError("expanse.torch.use(): installing the native allocator failed: " +
                           ext.expanse_torch_native_error().decode(errors="replace"))
    return NativeAllocator(path)


def use_host():
    """Makes expanse PyTorch's CUDA host allocator: torch.empty(..., pin_memory=True),
    Tensor.pin_memory(), DataLoader(pin_memory=True) and the pinned staging of non_blocking
    copies get expanse's pinned host memory (expanse.host): exact to the host granularity, where
    PyTorch's caching host allocator rounds each request up to a power of two, and fungible
    across sizes. torch.cuda.host_memory_stats() and torch._C._host_emptyCache() answer from
    expanse's host pools; pinned blocks PyTorch handed out before keep their own allocator.

    Reuse: a block a non_blocking copy used is reused once the streams PyTorch recorded are
    done (as PyTorch orders it); a block with no recorded stream, which PyTorch's own allocator
    hands out again at once, is reused only after every stream of its device has passed its
    free (a request that would pin more memory first synchronizes the device to prove it).

    CUDA graphs: a block allocated while a graph captures is the graph's until the graph is
    destroyed (its copies read it at every replay), and each torch.cuda.graph capture is
    announced to expanse, so that no host request proves frees by a synchronize that would
    invalidate it.

    Call it before starting threads that pin memory (DataLoader workers' pin thread):
    PyTorch's switch of host allocator is not thread-safe. Whether PyTorch reports the memory as
    pinned (Tensor.is_pinned()) is the driver's answer: see expanse.host.torch_sees_pinned();
    where it is no, pin_memory() copies a tensor that is pinned already.

    Independent of use(): expanse may serve the host side, the device side, or both. Needs the
    native extension (a C++ compiler, ninja, CUDA headers) and PyTorch 2.8 or newer, where
    at::setHostAllocator lets an extension replace the CUDA host allocator (2.10 or newer for
    CUDA graphs: the hooks above); otherwise raises NativeUnavailable saying which, and
    expanse.host.empty() still gives exact pinned tensors. Calling it again does nothing."""
    import torch
    _, ext = _load_native(torch)
    rc = ext.expanse_torch_native_install_host()
    if rc == 2:
        raise NativeUnavailable(ext.expanse_torch_native_host_error().decode(errors="replace"))
    if rc != 0:
        raise RuntimeError("expanse.torch.use_host(): installing the host allocator failed: " +
                           ext.expanse_torch_native_host_error().decode(errors="replace"))
    _announce_graph_captures(torch)


def host_in_use():
    """Whether expanse is PyTorch's CUDA host allocator now (use_host())."""
    ext = _native_ext
    return ext is not None and ext[1].expanse_torch_native_host_installed() == 1


def _announce_graph_captures(torch):
    """Makes torch.cuda.CUDAGraph announce its captures to expanse (expanse.capture_begin before
    the capture begins, capture_end after it ended): a context synchronize from any thread while
    a stream captures invalidates the capture, and only the announcement tells expanse not to
    run one. PyTorch gives a pluggable allocator no capture hooks from Python, so the methods
    torch.cuda.graph calls are wrapped (once)."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or getattr(graph, "_expanse_announces", False):
        return
    begin, end = graph.capture_begin, graph.capture_end

    def capture_begin(self, *args, **kwargs):
        # CUDAGraph captures on the current stream; the announcement names its context.
        stream = torch.cuda.current_stream()
        _expanse.capture_begin(stream)
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            _expanse.capture_end(stream)
            raise
        self._expanse_capture_stream = stream

    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            stream = getattr(self, "_expanse_capture_stream", None)
            if stream is not None:
                self._expanse_capture_stream = None
                _expanse.capture_end(stream)

    graph.capture_begin = capture_begin
    graph.capture_end = capture_end
    graph._expanse_announces = True


def in_use():
    """True once use() has made expanse PyTorch's allocator in this process."""
    return _allocator is not None


def native_in_use():
    """True once use() has made expanse PyTorch's native allocator in this process."""
    return isinstance(_allocator, NativeAllocator)


# ---- sleep and wake, shaped like vLLM's CuMemAllocator ------------------------------------------
# Tagged pools: allocations made inside use_memory_pool(tag) go to the tag's pool (the calling
# thread's, through expanse's thread routing), and sleep() / wake_up() act on the pools by tag. A
# vLLM-style engine switches with a few lines:
#
#     with expanse.torch.use_memory_pool("weights"):
#         model = load_model()
#     with expanse.torch.use_memory_pool("kv_cache"):
#         kv = allocate_kv_cache()
#     expanse.torch.sleep(offload_tags=("weights",))   # weights to host memory, the rest dropped
#     ...                                              # the GPU's memory serves others
#     expanse.torch.wake_up()                          # same addresses, weights back
_tag_pools = {}
_tag_lock = threading.Lock()


def _tag_pool(tag, device):
    key = (tag, device)
    with _tag_lock:
        pool = _tag_pools.get(key)
        if pool is None:
            pool = _expanse.Pool(device)
            _tag_pools[key] = pool
        return pool


class use_memory_pool:
    """Routes the calling thread's CUDA allocations on `device` (default: the current one) to the
    pool of `tag` for the scope, as vLLM's CuMemAllocator.use_memory_pool(tag) does."""

    def __init__(self, tag="default", device=None):
        if device is None:
            import torch
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        self.tag = tag
        self.pool = _tag_pool(tag, int(device))
        self._scope = None

    def __enter__(self):
        self._scope = _expanse.use_pool(self.pool)
        self._scope.__enter__()
        return self.pool

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)


def _empty_torch_cache():
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # torch absent, or a stand-in: expanse's own cache is emptied below
        pass


def sleep(offload_tags=()):
    """Puts every tagged pool to sleep: pools whose tag is in offload_tags keep their bytes in
    pinned host memory, the others drop them; their pages go back to the driver and their
    addresses stay. PyTorch's cache is emptied first, so that it holds nothing either. Raises
    RuntimeError if a pool cannot sleep now (a capture is under way)."""
    if isinstance(offload_tags, str):
        offload_tags = (offload_tags,)
    _empty_torch_cache()
    with _tag_lock:
        pools = list(_tag_pools.items())
    for (tag, device), pool in pools:
        if pool.asleep:
            continue
        if not pool.sleep(offload=tag in offload_tags):
            raise RuntimeError(f"expanse.torch.sleep: the pool of tag {tag!r} on device {device} "
                               "cannot sleep while a CUDA graph capture is under way")
    _expanse.empty_cache()


def wake_up(tags=None):
    """Wakes the tagged pools (all when tags is None): the same addresses, offloaded bytes back."""
    if isinstance(tags, str):
        tags = (tags,)
    with _tag_lock:
        pools = list(_tag_pools.items())
    for (tag, device), pool in pools:
        if (tags is None or tag in tags) and pool.asleep:
            pool.wake()
