"""Pinned host memory (expanse_host_*; docs/api.md, "Pinned host memory"): page-locked buffers of
exactly the asked size (to the host granularity), fungible across sizes, reused only once the
streams that used them are done.

    p = expanse.host.malloc(20 << 30)          # an int address; pinned, 20 GiB, not 32
    ...                                        # cudaMemcpyAsync / tensor copies from it
    expanse.host.free(p, stream)               # stream: an int CUstream, 0 for the NULL stream
    expanse.host.stats()["pinned_bytes"]

    t = expanse.host.empty((4096, 1024), torch.float16)   # a pinned CPU torch tensor, exact
    gpu = t.to("cuda", non_blocking=True)
    del t   # reused once every stream of the device has passed this point (see empty())

    buf = expanse.host.buffer(1 << 20)         # any DLPack consumer: numpy.from_dlpack(buf)
"""
import ctypes
import sys

from ._lib import check, library

__all__ = ["malloc", "free", "free_after_device", "record_stream", "empty_cache", "set_limit",
           "stats", "buffer", "HostBuffer", "empty", "torch_sees_pinned"]


class HostStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64) for name in (
            "requested_bytes", "allocated_bytes", "pinned_bytes", "mapped_bytes",
            "peak_pinned_bytes", "limit_bytes", "live_blocks", "pending_blocks", "num_allocs",
            "num_frees", "num_created_pages", "num_released_pages", "num_remapped_pages",
            "num_waits", "num_ooms", "page_bytes", "path")
    ]


_PATHS = {0: None, 1: "vmm", 2: "registered"}
_declared = False


def _lib():
    global _declared
    lib = library()
    if not _declared:
        c = ctypes
        sigs = {
            "expanse_host_malloc": (c.c_int, [c.POINTER(c.c_void_p), c.c_size_t, c.c_int,
                                              c.c_void_p]),
            "expanse_host_free": (c.c_int, [c.c_void_p, c.c_void_p]),
            "expanse_host_record_stream": (c.c_int, [c.c_void_p, c.c_void_p]),
            "expanse_host_free_after_device": (c.c_int, [c.c_void_p, c.c_int, c.c_uint]),
            "expanse_host_dlpack": (c.c_int, [c.c_void_p, c.c_int, c.POINTER(c.c_void_p)]),
            "expanse_host_release_cached": (c.c_int, []),
            "expanse_host_set_limit": (c.c_int, [c.c_size_t]),
            "expanse_host_get_stats": (c.c_int, [c.c_int, c.POINTER(HostStats)]),
        }
        for name, (res, args) in sigs.items():
            f = getattr(lib, name)
            f.restype = res
            f.argtypes = args
        _declared = True
    return lib


def malloc(size, numa_node=-1, stream=0):
    """A pinned block of `size` bytes on `numa_node` (-1: the node nearest the stream's device);
    its address as an int. Raises ExpanseError (out of memory: within host_limit)."""
    p = ctypes.c_void_p()
    check(_lib().expanse_host_malloc(ctypes.byref(p), size, numa_node, stream),
          f"expanse.host.malloc({size})")
    return p.value


def free(ptr, stream=0):
    """Frees a block; its memory is used again once the work on `stream` (and on the streams
    record_stream named) is done."""
    check(_lib().expanse_host_free(ptr, stream), f"expanse.host.free({ptr:#x})")


def free_after_device(ptr, device=-1, every_stream=False):
    """Frees a block whose last user named no stream: reused once the streams record_stream
    named are done, or, where none was named (or every_stream), once every stream of `device`
    (-1: the block's own, the CUDA context current when it was allocated) has passed this call;
    a later request that would pin new memory synchronizes that device first to prove it."""
    check(_lib().expanse_host_free_after_device(ptr, device, 1 if every_stream else 0),
          f"expanse.host.free_after_device({ptr:#x})")


def record_stream(ptr, stream):
    check(_lib().expanse_host_record_stream(ptr, stream), f"expanse.host.record_stream({ptr:#x})")


def empty_cache():
    """Gives back the pinned pages no block uses."""
    check(_lib().expanse_host_release_cached(), "expanse.host.empty_cache()")


def set_limit(nbytes):
    """Most pinned bytes per NUMA node (None: no limit)."""
    check(_lib().expanse_host_set_limit(2**64 - 1 if nbytes is None else nbytes),
          "expanse.host.set_limit()")


def stats(numa_node=-1):
    """The pool's figures as a dict; "path" is "vmm" (HOST_NUMA pages) or "registered" (the
    fallback where the driver lacks host VMM), None before the first block."""
    s = HostStats()
    s.struct_size = ctypes.sizeof(HostStats)
    check(_lib().expanse_host_get_stats(numa_node, ctypes.byref(s)), "expanse.host.stats()")
    out = {name: getattr(s, name) for name, _ in HostStats._fields_ if name != "struct_size"}
    out["path"] = _PATHS.get(s.path, s.path)
    if out["limit_bytes"] == 2**64 - 1:
        out["limit_bytes"] = None
    return out


# ---- DLPack and torch tensors ----------------------------------------------------------------

class _DLManagedTensor(ctypes.Structure):
    """The unversioned DLPack struct, as far as the capsule's destructor needs it."""
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_DLTENSOR = b"dltensor"  # the capsule keeps a pointer to its name: this object outlives it


def _capi(name, restype, *argtypes):
    """A private prototype of a C API function (ctypes.pythonapi's attributes are shared with
    every other user in the process: setting their argtypes would change them for all)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     ctypes.c_void_p)


_capsule_is_named = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)


def _stream_handle(stream):
    """An int CUstream from an int or a torch.cuda.Stream."""
    return getattr(stream, "cuda_stream", stream)


class HostBuffer:
    """A pinned block for one DLPack consumer (torch.from_dlpack, numpy.from_dlpack, ...): a
    one-dimensional uint8 array of exactly `size` bytes, on the CPU. Consumed, it belongs to the
    array: the array's last reference frees it (free_after_device(ptr, device): after the
    streams named here, or after every stream of `device`). Never consumed, it is freed with this
    object; a capsule taken from __dlpack__ and kept unconsumed past this object keeps the block
    live (its consumer, if any, frees it)."""

    def __init__(self, size, numa_node=-1, device=-1, streams=()):
        self._owned = False
        self._capsule = None
        count = library().expanse_device_count()
        if not isinstance(device, int) or device < -1 or (count >= 0 and device >= count):
            raise ValueError(f"expanse.host.HostBuffer: device {device!r} (0 to {count - 1}, "
                             "or -1 for the block's own)")
        self.size = size
        self.device = device
        self.ptr = malloc(size, numa_node)
        self._owned = True
        try:
            for s in streams:
                record_stream(self.ptr, _stream_handle(s))
        except BaseException:
            free(self.ptr)
            self._owned = False
            raise

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != (1, 0):
            raise BufferError(f"expanse.host.HostBuffer: host memory, not device {dl_device}")
        if not self._owned and not (self._capsule is not None and
                                    _capsule_is_named(self._capsule[0], _DLTENSOR)):
            # A consumer owns the block (and may have freed it): nothing here to copy from.
            raise BufferError(f"expanse.host.HostBuffer at {self.ptr:#x}: handed to a consumer "
                              "already (a buffer has one owner)")
        if copy:
            # A copy in a block of its own, which the consumer owns as it would own this one.
            other = HostBuffer(self.size, device=self.device)
            ctypes.memmove(other.ptr, self.ptr, self.size)
            return other.__dlpack__()
        if not self._owned:
            raise BufferError(f"expanse.host.HostBuffer at {self.ptr:#x}: handed to a consumer "
                              "already (a buffer has one owner)")
        managed = ctypes.c_void_p()
        check(_lib().expanse_host_dlpack(self.ptr, self.device, ctypes.byref(managed)),
              f"expanse.host.HostBuffer.__dlpack__({self.ptr:#x})")
        try:
            # No destructor: a ctypes callback could run during interpreter exit after its code
            # is gone. An unconsumed capsule is settled by this object instead (__del__).
            capsule = _capsule_new(managed, _DLTENSOR, None)
        except BaseException:
            self._owned = False  # the deleter below frees the block: __del__ must not again
            _DLManagedTensor.from_address(managed.value).deleter(managed.value)
            raise
        self._owned = False
        self._capsule = (capsule, managed.value)
        return capsule

    def __del__(self):
        try:
            if getattr(self, "_owned", False):
                self._owned = False
                free_after_device(self.ptr, self.device)
            elif getattr(self, "_capsule", None) is not None:
                capsule, managed = self._capsule
                self._capsule = None
                # Still named "dltensor": nobody consumed it. Held only here (and by this
                # frame's reference), nobody can: its tensor is deleted, which frees the block.
                if _capsule_is_named(capsule, _DLTENSOR) and sys.getrefcount(capsule) <= 2:
                    _DLManagedTensor.from_address(managed).deleter(managed)
        except Exception:  # the runtime is gone (interpreter exit): nothing to give back to
            pass


def buffer(size, numa_node=-1, device=-1, streams=()):
    """A HostBuffer of `size` bytes (see HostBuffer)."""
    return HostBuffer(size, numa_node, device, streams)


def _torch_device(torch, device):
    if device is not None:
        return device if isinstance(device, int) else torch.device(device).index or 0
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        return cuda.current_device()
    return -1


_pinned_seen = None  # torch_sees_pinned's answer, once per process


def torch_sees_pinned():
    """Whether PyTorch reports expanse's pinned memory as pinned (Tensor.is_pinned(), which asks
    the CUDA runtime's cudaPointerGetAttributes); None where PyTorch has no CUDA device to ask.
    Where it says False: Tensor.pin_memory() and DataLoader(pin_memory=True) copy such a tensor
    into PyTorch's own pinned memory, and PyTorch's checks that want pinned memory refuse it; the
    driver still copies from it asynchronously (it is page-locked and mapped for the device)."""
    global _pinned_seen
    import torch
    if not torch.cuda.is_available():
        return None
    if _pinned_seen is None:
        probe = empty(1, torch.uint8)
        _pinned_seen = bool(probe.is_pinned())
        del probe
    return _pinned_seen


def empty(size, dtype=None, *, numa_node=-1, device=None, streams=()):
    """A CPU torch tensor of shape `size` (an int or a tuple) and `dtype` (default
    torch.get_default_dtype()) in expanse's pinned memory: exactly its bytes, rounded to the host
    granularity, with no power-of-two rounding. Copies to and from a GPU with non_blocking=True
    are asynchronous.

    The tensor's last reference frees the block (any thread, no interpreter lock needed). Its
    memory is reused only after every stream of `device` (default: the current CUDA device) has
    passed that point, since nothing tells expanse which streams copied from it; expanse
    synchronizes the device before it pins more while such memory waits. Name the streams that
    use it (`streams=[s, ...]`, torch.cuda.Stream or int handles) and its reuse waits for those
    alone, with no synchronize.

    If PyTorch does not report this memory as pinned (torch_sees_pinned()), a warning says so,
    once."""
    import torch
    shape = (size,) if isinstance(size, int) else tuple(size)
    dtype = dtype or torch.get_default_dtype()
    n = 1
    for d in shape:
        if d < 0:
            raise ValueError(f"expanse.host.empty: negative dimension {d} in {shape}")
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)  # nothing to pin
    buf = HostBuffer(nbytes, numa_node, _torch_device(torch, device), streams)
    t = torch.from_dlpack(buf)
    if dtype != torch.uint8:
        t = t.view(dtype)
    t = t.view(shape)
    global _pinned_seen
    if _pinned_seen is None and torch.cuda.is_available():
        _pinned_seen = bool(t.is_pinned())
        if not _pinned_seen:
            import warnings
            warnings.warn("expanse.host.empty: PyTorch does not report expanse's pinned memory as "
                          "pinned (Tensor.is_pinned() is False): pin_memory() and "
                          "DataLoader(pin_memory=True) will copy such tensors into PyTorch's own "
                          "pinned memory; copies with non_blocking=True still run "
                          "asynchronously", RuntimeWarning, stacklevel=2)
    return t
