"""Pinned host memory (expanse_host_*; docs/api.md, "Pinned host memory"): page-locked buffers of
exactly the asked size (to the host granularity), fungible across sizes, reused only once the
streams that used them are done.

    p = expanse.host.malloc(20 << 30)          # an int address; pinned, 20 GiB, not 32
    ...                                        # cudaMemcpyAsync / tensor copies from it
    expanse.host.free(p, stream)               # stream: an int CUstream, 0 for the NULL stream
    expanse.host.stats()["pinned_bytes"]

Pointers are ints. A torch tensor over such memory is not made here yet: copy into it with
ctypes or wrap it with the tensor library's own from-pointer call, keeping the block live.
"""
import ctypes

from ._lib import check, library

__all__ = ["malloc", "free", "record_stream", "empty_cache", "set_limit", "stats"]


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
