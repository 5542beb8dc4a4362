"""expanse: a virtual-memory GPU allocator, from Python.

Everything here works without PyTorch; `expanse.torch` makes expanse PyTorch's CUDA allocator.
The library is found through EXPANSE_LIBRARY, inside this package (where `pip install` puts it),
where `cmake --install` put it, or on the loader path.
Configuration: EXPANSE_CONF (see the README), or expanse.init(conf).

    import expanse
    expanse.memory_stats()["allocated_bytes.all.current"]
    expanse.record_history(True)
    ...
    expanse.dump_snapshot("snap.pickle")   # pytorch.org/memory_viz, `expanse replay`
"""
import ctypes
import os
import sys

from ._lib import ExpanseError, check, last_error, library, library_path, stats_type

__all__ = [
    "ExpanseError", "init", "shutdown", "driver_description", "device_count", "library",
    "library_path", "memory_stats", "memory_summary", "empty_cache", "set_limit",
    "reset_peak_stats", "record_history", "dump_snapshot", "capture_begin", "capture_end",
    "announced_capture", "Pool", "use_pool", "graph_pool", "release_host_backup", "ipc",
    "reserve", "unreserve", "host",
]

from . import host  # noqa: E402  (expanse.host: pinned host memory)
from . import ipc  # noqa: E402  (expanse.ipc: sharing blocks with other processes)

DEFAULT_MAX_ENTRIES = 100000  # PyTorch's default for _record_memory_history


def init(conf):
    """Configures expanse with an EXPANSE_CONF-style string (no block may be live)."""
    check(library().expanse_init(conf.encode()), f"expanse.init({conf!r})")


def shutdown():
    """Gives everything back to the driver (no block may be live); EXPANSE_CONF applies again."""
    check(library().expanse_shutdown(), "expanse.shutdown()")


def driver_description():
    d = library().expanse_driver_description()
    if d is None:
        raise ExpanseError(f"expanse.driver_description(): {last_error()}")
    return d.decode()


def device_count():
    n = library().expanse_device_count()
    if n < 0:
        raise ExpanseError(f"expanse.device_count(): {last_error()}")
    return n


def _device(device):
    """PyTorch's convention: None is the current device (0 when PyTorch has not set up CUDA)."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0
    if isinstance(device, str):  # "cuda:1"
        return int(device.split(":")[1]) if ":" in device else 0
    if isinstance(device, int):
        return device
    if hasattr(device, "index"):  # torch.device
        return 0 if device.index is None else device.index
    return int(device)


def _raw_stats(device):
    stats = stats_type()
    s = stats()
    s.struct_size = ctypes.sizeof(stats)
    check(library().expanse_get_stats(device, ctypes.byref(s)), f"expanse stats of device {device}")
    return s


def memory_stats(device=None):
    """A dict with the keys torch.cuda.memory_stats() uses where the meaning matches, plus
    expanse's own figures under "expanse.*".

    allocated_bytes: live blocks as carved (512 B granularity); requested_bytes: as asked;
    reserved_bytes: physical memory expanse holds from the driver (mapped + pooled);
    active_bytes: the same as allocated_bytes (expanse reuses a freed block at once on its stream).
    """
    d = _device(device)
    s = _raw_stats(d)
    out = {
        "allocated_bytes.all.current": s.allocated_bytes,
        "allocated_bytes.all.peak": s.peak_allocated_bytes,
        "requested_bytes.all.current": s.requested_bytes,
        "requested_bytes.all.peak": s.peak_requested_bytes,
        "active_bytes.all.current": s.allocated_bytes,
        "active_bytes.all.peak": s.peak_allocated_bytes,
        "reserved_bytes.all.current": s.physical_bytes,
        "reserved_bytes.all.peak": s.peak_physical_bytes,
        "inactive_split_bytes.all.current": s.cached_bytes,
        "allocation.all.current": s.live_blocks,
        "active.all.current": s.live_blocks,
        "allocation.all.allocated": s.num_allocs,
        "allocation.all.freed": s.num_frees,
        "num_ooms": s.num_ooms,
        "num_alloc_retries": 0,
        "num_device_alloc": s.num_created_pages,
        "num_device_free": s.num_released_pages,
    }
    for name, _ in type(s)._fields_:
        if name in ("struct_size", "driver_calls", "num_entry_points"):
            continue
        out["expanse." + name] = getattr(s, name)
    lib = library()
    for i in range(s.num_entry_points):
        if s.driver_calls[i]:
            out["expanse.driver_calls." + lib.expanse_entry_point_name(i).decode()] = \
                s.driver_calls[i]
    if s.limit_bytes == 2**64 - 1:
        out["expanse.limit_bytes"] = None
    return out


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0
    return str(n)


def memory_summary(device=None, abbreviated=False):
    """A readable table of memory_stats(), like torch.cuda.memory_summary()."""
    d = _device(device)
    s = _raw_stats(d)
    rows = [
        ("Requested memory", s.requested_bytes, s.peak_requested_bytes),
        ("Allocated memory", s.allocated_bytes, s.peak_allocated_bytes),
        ("Mapped memory", s.mapped_bytes, s.peak_mapped_bytes),
        ("Reserved (physical) memory", s.physical_bytes, s.peak_physical_bytes),
        ("VA reserved", s.va_reserved_bytes, s.peak_va_reserved_bytes),
    ]
    lines = [f"expanse memory summary, device {d} ({driver_description()})",
             f"{'':28}{'current':>16}{'peak':>16}"]
    for name, cur, peak in rows:
        lines.append(f"{name:28}{_fmt(cur):>16}{_fmt(peak):>16}")
    if not abbreviated:
        limit = "none" if s.limit_bytes == 2**64 - 1 else _fmt(s.limit_bytes)
        lines += [
            f"{'Cached (mapped, free)':28}{_fmt(s.cached_bytes):>16}",
            f"{'Reserved, unused':28}{_fmt(s.reserved_unused_bytes):>16}  of "
            f"{_fmt(s.reserved_bytes)} reserved"
            + (f" (asked {_fmt(s.reserve_asked_bytes)}: partial)"
               if s.reserve_asked_bytes > s.reserved_bytes else ""),
            f"{'Pooled (unmapped)':28}{_fmt(s.pooled_bytes):>16}",
            f"Live blocks {s.live_blocks}, allocs {s.num_allocs}, frees {s.num_frees}, "
            f"OOMs {s.num_ooms}",
            f"Pages: created {s.num_created_pages}, released {s.num_released_pages}, reclaimed "
            f"{s.num_reclaimed_pages}; page size {_fmt(s.page_size)}",
            f"Capacity {_fmt(s.capacity_bytes)}, limit {limit}; driver calls "
            f"{s.driver_calls_total}",
        ]
        if s.num_free_size_mismatches or s.num_unknown_frees:
            lines.append(f"Frees with a wrong size {s.num_free_size_mismatches}, "
                         f"of unknown pointers {s.num_unknown_frees}")
    return "\n".join(lines) + "\n"


def empty_cache():
    """Unmaps and releases every cached page of every device (after the streams' work on freed
    memory completes), as torch.cuda.empty_cache() does for PyTorch's own allocator."""
    lib = library()
    for d in range(device_count()):
        check(lib.expanse_release_cached(d), f"expanse.empty_cache() on device {d}")


def release_host_backup(device=None):
    """Frees the pinned host staging that pools keep between sleeps (Pool.sleep), for every awake
    pool of device (default: all devices)."""
    lib = library()
    for d in ([_device(device)] if device is not None else range(device_count())):
        check(lib.expanse_release_host_backup(d), f"expanse.release_host_backup() on device {d}")


def set_limit(bytes_or_fraction, device=None):
    """Caps the physical memory expanse holds on device: a number of bytes (int), a fraction of
    the device's capacity (float in (0, 1], like torch.cuda.set_per_process_memory_fraction), or
    None to remove the cap."""
    d = _device(device)
    if bytes_or_fraction is None:
        limit = 2**64 - 1
    elif isinstance(bytes_or_fraction, float):
        if not 0.0 < bytes_or_fraction <= 1.0:
            raise ValueError(f"expanse.set_limit: fraction {bytes_or_fraction} is not in (0, 1]")
        limit = int(_raw_stats(d).capacity_bytes * bytes_or_fraction)
    elif isinstance(bytes_or_fraction, int) and not isinstance(bytes_or_fraction, bool):
        if bytes_or_fraction < 0:
            raise ValueError(f"expanse.set_limit: negative size {bytes_or_fraction}")
        limit = bytes_or_fraction
    else:
        raise TypeError("expanse.set_limit: expected bytes (int), a fraction (float) or None, "
                        f"got {type(bytes_or_fraction).__name__}")
    check(library().expanse_set_limit(d, min(limit, 2**64 - 1)), f"expanse.set_limit on device {d}")


def reserve(amount, device=None):
    """Holds physical memory on device from now on, used or not: no other process can take it,
    allocations it covers take no memory beyond it, and empty_cache() keeps it. amount: bytes, a
    fraction of the device's capacity (float in (0, 1]), "free" (all the driver says is free, less
    EXPANSE_CONF reserve_margin, 512 MiB by default), or None / 0 to give it back. Grows or shrinks
    the reservation; returns the bytes reserved. Raises ExpanseError when the driver cannot give it
    whole (the message says what was asked, free and taken; nothing more is held) unless
    EXPANSE_CONF reserve_partial:true, which keeps what it gave."""
    d = _device(device)
    lib = library()
    if amount is None or (isinstance(amount, int) and amount == 0 and not isinstance(amount, bool)):
        check(lib.expanse_unreserve(d), f"expanse.unreserve on device {d}")
        return 0
    if amount == "free":
        want = 2**64 - 1
    elif isinstance(amount, float):
        if not 0.0 < amount <= 1.0:
            raise ValueError(f"expanse.reserve: fraction {amount} is not in (0, 1]")
        want = int(_raw_stats(d).capacity_bytes * amount)
    elif isinstance(amount, int) and not isinstance(amount, bool):
        if amount < 0:
            raise ValueError(f"expanse.reserve: negative size {amount}")
        want = min(amount, 2**64 - 2)
    else:
        raise TypeError("expanse.reserve: expected bytes (int), a fraction (float), \"free\" or "
                        f"None, got {amount!r}")
    got = ctypes.c_size_t(0)
    check(lib.expanse_reserve(d, want, ctypes.byref(got)), f"expanse.reserve on device {d}")
    return got.value


def unreserve(device=None):
    """Gives the reservation of device back (reserve(None))."""
    return reserve(None, device)


def reset_peak_stats(device=None):
    d = _device(device)
    check(library().expanse_reset_peak_stats(d), f"expanse.reset_peak_stats on device {d}")


def record_history(enabled=True, max_entries=DEFAULT_MAX_ENTRIES):
    """Starts (a new trace, the last max_entries entries per device kept) or stops recording
    what the allocator does, like torch.cuda.memory._record_memory_history(). Stopping keeps
    the trace for dump_snapshot()."""
    if max_entries < 0:
        raise ValueError(f"expanse.record_history: negative max_entries {max_entries}")
    check(library().expanse_record_history(1 if enabled else 0, max_entries),
          "expanse.record_history")


def dump_snapshot(path):
    """Writes a snapshot pickle in PyTorch's format (torch.cuda.memory._dump_snapshot()):
    drop it on pytorch.org/memory_viz, or run `expanse replay PATH`."""
    check(library().expanse_dump_snapshot(os.fsencode(path)), f"expanse.dump_snapshot({path!r})")


def _stream_handle(stream):
    """A CUstream value from None (NULL: the current context), an int, or an object with
    .cuda_stream (torch.cuda.Stream)."""
    if stream is None:
        return None
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(f"expanse: a stream is an int handle or has .cuda_stream, not {stream!r}")
    return handle or None


def capture_begin(stream=None):
    """Announces a CUDA graph capture about to begin on stream (before cudaStreamBeginCapture):
    until capture_end, expanse never synchronizes the stream's context, which would invalidate
    the capture from any thread. expanse.torch.use() announces torch.cuda.graph captures."""
    check(library().expanse_capture_begin(_stream_handle(stream)), "expanse.capture_begin()")


def capture_end(stream=None):
    """Ends an announcement made by capture_begin (after cudaStreamEndCapture)."""
    check(library().expanse_capture_end(_stream_handle(stream)), "expanse.capture_end()")


class announced_capture:
    """with expanse.announced_capture(stream): ... capture on stream ...  (capture_begin/end)."""

    def __init__(self, stream=None):
        self.stream = stream

    def __enter__(self):
        capture_begin(self.stream)
        return self

    def __exit__(self, *exc):
        capture_end(self.stream)
        return False


class Pool:
    """A private reuse domain on one device (expanse_pool_*): only allocations routed to it
    reuse its memory, and while it is in use no other pool takes its pages, so a CUDA graph
    captured into it may use the same addresses on every replay.

        pool = expanse.Pool(device=0)
        with expanse.graph_pool(pool, stream):   # before the capture begins
            ... capture on stream ...
        pool.release()                           # when the graph is gone

    The object holds one use of the pool (use count 1 at creation); release() (or leaving a
    `with Pool() as p:` block) gives it up. Its memory returns to others once no use is left and
    its work is proven done (empty_cache(), or an allocation that needs it).

    registrable=True: every block is one physical handle of its own, exportable to other
    processes (expanse.ipc) and registrable with NCCL and NICs (expanse_pool_create_registrable).
    """

    def __init__(self, device=0, registrable=False):
        self.device = _device(device)
        pid = ctypes.c_ulonglong(0)
        create = (library().expanse_pool_create_registrable if registrable
                  else library().expanse_pool_create)
        check(create(self.device, ctypes.byref(pid)),
              f"expanse.Pool(device={self.device}, registrable={registrable})")
        self.id = pid.value
        self._released = False

    def stats(self):
        """A dict of expanse_pool_stats: id, device, use_count, released, returned, live_blocks,
        requested_bytes, live_bytes, cached_bytes, physical_bytes, asleep, host_backup_bytes,
        and of the latest sleep and wake: sleeps, released_bytes (given back to the driver),
        sleep_ns / wake_ns (timed), sleep_modeled_ns / wake_modeled_ns (cost model)."""
        from ._lib import PoolStats
        s = PoolStats()
        s.struct_size = ctypes.sizeof(PoolStats)
        check(library().expanse_pool_get_stats(self.id, ctypes.byref(s)),
              f"expanse.Pool.stats() of pool {self.id}")
        out = {name: getattr(s, name) for name, _ in PoolStats._fields_
               if name not in ("struct_size", "reserved0")}
        for flag in ("released", "returned", "asleep"):
            out[flag] = bool(out[flag])
        return out

    def sleep(self, offload=True, stream=None, zero_on_wake=False):
        """Gives the pool's pages back to the driver, keeping its addresses (pointers and CUDA
        graphs over them stay valid). offload=True keeps its live blocks' bytes in pinned host
        memory for wake(); offload=False drops them (zero_on_wake=True: they come back zeroed).
        Returns False, with nothing changed, while a capture is announced on its device or routed
        into it."""
        from ._lib import EBUSY
        if offload and zero_on_wake:
            raise ValueError(f"expanse.Pool.sleep of pool {self.id}: zero_on_wake=True needs "
                             "offload=False (offloaded bytes come back as they were)")
        # EXPANSE_SLEEP_OFFLOAD, EXPANSE_SLEEP_DISCARD, | EXPANSE_SLEEP_ZERO_ON_WAKE
        mode = 1 if offload else (2 | 4 if zero_on_wake else 2)
        rc = library().expanse_pool_sleep(self.id, mode, _stream_handle(stream))
        if rc == EBUSY:
            return False
        check(rc, f"expanse.Pool.sleep(offload={offload}) of pool {self.id}")
        return True

    def wake(self, stream=None):
        """Maps the pool's pages again at the same addresses and brings offloaded bytes back;
        done when it returns."""
        check(library().expanse_pool_wake(self.id, _stream_handle(stream)),
              f"expanse.Pool.wake() of pool {self.id}")

    @property
    def asleep(self):
        rc = library().expanse_pool_is_asleep(self.id)
        if rc < 0:
            check(-rc, f"expanse.Pool.asleep of pool {self.id}")
        return rc == 1

    def malloc(self, size, stream=None):
        """size bytes in this pool, ordered on stream (of the pool's device); an int address.
        Free it with expanse.library().expanse_free."""
        p = library().expanse_pool_malloc(self.id, size, _stream_handle(stream))
        if not p and size:
            raise ExpanseError(f"expanse.Pool.malloc({size}) of pool {self.id}: {last_error()}")
        return p

    def retain(self):
        """One more use (each must be given up with release_use())."""
        check(library().expanse_pool_retain(self.id), f"expanse.Pool.retain() of pool {self.id}")

    def release_use(self):
        check(library().expanse_pool_release(self.id), f"expanse.Pool.release_use() of pool {self.id}")

    def release(self):
        """Gives up this object's use (once; later calls do nothing)."""
        if self._released:
            return
        self._released = True
        check(library().expanse_pool_release(self.id), f"expanse.Pool.release() of pool {self.id}")

    def trim(self):
        """Gives a released pool's cached memory back now; False when a capture is announced on
        its device (try again after it ends)."""
        from ._lib import EBUSY
        rc = library().expanse_pool_trim(self.id)
        if rc == EBUSY:
            return False
        check(rc, f"expanse.Pool.trim() of pool {self.id}")
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return f"expanse.Pool(id={self.id}, device={self.device})"


def _pool_id(pool):
    return pool.id if isinstance(pool, Pool) else int(pool)


class use_pool:
    """with expanse.use_pool(pool): every allocation this thread makes on the pool's device goes
    to the pool (expanse_pool_begin_thread / expanse_pool_end). Scopes nest: the newest wins."""

    def __init__(self, pool):
        self.pool_id = _pool_id(pool)

    def __enter__(self):
        check(library().expanse_pool_begin_thread(self.pool_id),
              f"expanse.use_pool(pool {self.pool_id})")
        return self

    def __exit__(self, *exc):
        check(library().expanse_pool_end(self.pool_id), f"expanse.use_pool(pool {self.pool_id}) end")
        return False


class graph_pool:
    """with expanse.graph_pool(pool, stream): every allocation made on a stream of the capture
    that stream is in (or begins in the block: enter before cudaStreamBeginCapture) goes to the
    pool, side streams forked into the capture included; the capture is announced too (see
    capture_begin). stream: an int handle or an object with .cuda_stream (torch.cuda.Stream)."""

    def __init__(self, pool, stream):
        self.pool_id = _pool_id(pool)
        self.stream = _stream_handle(stream)

    def __enter__(self):
        check(library().expanse_pool_begin_capture(self.pool_id, self.stream),
              f"expanse.graph_pool(pool {self.pool_id})")
        return self

    def __exit__(self, *exc):
        check(library().expanse_pool_end(self.pool_id),
              f"expanse.graph_pool(pool {self.pool_id}) end")
        return False
