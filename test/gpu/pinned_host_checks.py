"""expanse's pinned host memory with PyTorch on a real GPU: which path the driver gives (HOST_NUMA
pages or the registered fallback), whether PyTorch reports the memory as pinned, host-to-device
bandwidth beside PyTorch's own pinned memory (cudaHostAlloc), a deleter's free under a running
copy, a sleep's backup in the host pools, and expanse as PyTorch's host allocator (use_host). Each check prints ok / FAIL / note; the
script exits 1 if any check failed, 77 (skipped) without PyTorch or a GPU.

    EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY=build/lib/libexpanse.so \\
        python3 test/gpu/pinned_host_checks.py          (test/gpu/run_on_gpu.sh: pinned-host)

The bandwidth check asks for expanse's figure within 5 % of PyTorch's pinned memory's, the best of
several 1 GiB copies each (prints both). use_host needs the native extension (a C++ compiler,
ninja, CUDA headers) and PyTorch 2.8 or newer; without them its checks are notes.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from gpu_check_harness import check, finish, note, torch_on_a_gpu  # noqa: E402

torch = torch_on_a_gpu()

import expanse  # noqa: E402
import expanse.host  # noqa: E402
import expanse.torch  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
torch.cuda.init()


def path_and_exactness():
    t = expanse.host.empty(20 * MiB + 1, torch.uint8)
    s = expanse.host.stats()
    assert s["requested_bytes"] == 20 * MiB + 1, s
    assert s["allocated_bytes"] <= 22 * MiB, s
    del t
    return f"path {s['path']}, {s['allocated_bytes']} bytes placed for 20 MiB + 1, page {s['page_bytes']}"


def h2d_gbps(src, dst, reps=5):
    best = 0.0
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        best = max(best, src.numel() / (a.elapsed_time(b) / 1e3) / 1e9)
    return best


def bandwidth_within_5_percent():
    dst = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    ours = expanse.host.empty(GiB, torch.uint8)
    ours.fill_(7)
    theirs = torch.empty(GiB, dtype=torch.uint8, pin_memory=True)
    theirs.fill_(7)
    e, p = h2d_gbps(ours, dst), h2d_gbps(theirs, dst)
    del ours, theirs, dst
    detail = f"expanse {e:.1f} GB/s, PyTorch's pinned memory {p:.1f} GB/s ({e / p:.3f}x)"
    assert e >= 0.95 * p, detail
    return detail


def copy_is_asynchronous():
    # A copy queued behind a long kernel returns at once from pinned memory; from pageable memory
    # the driver stages it first.
    src = expanse.host.empty(256 * MiB, torch.uint8)
    dst = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(200_000_000)
    import time
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    del src, dst
    assert issued < 0.05, f"the copy call took {issued * 1e3:.1f} ms (staged, not asynchronous)"
    return f"the call returned in {issued * 1e3:.2f} ms behind a running kernel"


def deleter_free_waits_for_the_copy():
    # The tensor is dropped while a copy from it runs on a side stream behind a long kernel; the
    # next request (needing its pages: the limit) must not overwrite it before the copy ran.
    expanse.host.empty_cache()
    side = torch.cuda.Stream()
    n = 64 * MiB
    src = expanse.host.empty(n, torch.uint8)
    src.fill_(0xA1)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        dst.copy_(src, non_blocking=True)
    del src
    nxt = expanse.host.empty(n, torch.uint8)
    nxt.fill_(0x5B)
    torch.cuda.synchronize()
    got = int(dst[n // 2].item())
    del nxt, dst
    assert got == 0xA1, f"the copy read {got:#x}: the block was reused under it"
    return f"num_waits {expanse.host.stats()['num_waits']}"


def use_host_pins_exactly():
    try:
        expanse.torch.use_host()
    except expanse.torch.NativeUnavailable as e:
        return f"not installed here ({e})"
    before = expanse.host.stats()["allocated_bytes"]
    x = torch.empty(20 * MiB + 1, dtype=torch.uint8, pin_memory=True)
    placed = expanse.host.stats()["allocated_bytes"] - before
    assert placed <= 22 * MiB, f"{placed} bytes placed for 20 MiB + 1"
    x.fill_(3)
    y = x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert int(y[-1].item()) == 3
    pinned = x.is_pinned()
    del x, y
    st = torch.cuda.host_memory_stats()
    return f"{placed} bytes for 20 MiB + 1, is_pinned {pinned}, host_memory_stats {dict(st)}"


class _DeviceBytes:
    """Device memory expanse handed out, seen by PyTorch without a copy."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3}


def sleep_wake_backs_up_in_the_host_pool():
    # A pool put to sleep with its bytes offloaded keeps them in the host pools' pages (not a
    # cuMemHostAlloc of its own), and wakes with them.
    n = 256 * MiB
    pool = expanse.Pool(device=0)
    p = pool.malloc(n)
    dev = torch.as_tensor(_DeviceBytes(p, n), device="cuda")
    dev.fill_(0x42)
    torch.cuda.synchronize()
    pinned_before = expanse.host.stats()["pinned_bytes"]
    pool.sleep(offload=True)
    backup = pool.stats()["host_backup_bytes"]
    pinned_asleep = expanse.host.stats()["pinned_bytes"]
    pool.wake()
    ok = int(dev[0].item()) == 0x42 and int(dev[n - 1].item()) == 0x42
    del dev
    expanse.library().expanse_free(p, n, 0, None)
    pool.release()
    assert ok, "the woken pool lost its bytes"
    assert backup >= n, f"host_backup_bytes {backup}"
    assert pinned_asleep - pinned_before >= n, (
        f"the host pools pinned {pinned_asleep - pinned_before} bytes for a {n}-byte backup")
    return f"backup {backup} bytes in the host pools (path {expanse.host.stats()['path']})"


check("the driver's path and an exact block", path_and_exactness)
note("PyTorch reports expanse's pinned memory as pinned (is_pinned)", expanse.host.torch_sees_pinned)
check("a non_blocking copy from it is asynchronous", copy_is_asynchronous)
check("host-to-device bandwidth within 5 % of PyTorch's pinned memory", bandwidth_within_5_percent)
check("a tensor dropped under a running copy is not reused before it ran",
      deleter_free_waits_for_the_copy)
check("a sleep's backup lives in the host pools and the wake brings it back",
      sleep_wake_backs_up_in_the_host_pool)
check("expanse as PyTorch's host allocator: pin_memory=True is exact", use_host_pins_exactly)
note("host stats", expanse.host.stats)
finish()
