"""expanse as PyTorch's native allocator (expanse.torch.use(native=True)), checked on a real GPU:
what docs/integrations.md says the native allocator answers (the CUDA graph and MemPool checks
below have not been run on a GPU yet). Each check prints ok / FAIL / note;
the script exits 1 if any check failed, 77 (skipped) without PyTorch or a GPU.

    EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY=build/lib/libexpanse.so \\
        python3 test/gpu/torch_native_checks.py          (test/gpu/run_on_gpu.sh: torch-native)

Needs a C++ compiler, ninja and the CUDA headers there: the native allocator is compiled against
the installed torch at use(). Every check runs in this one process (the allocator can be chosen
only before CUDA is initialized), ordered from safe to risky.
"""
import os
import pathlib
import pickle
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from gpu_check_harness import check, finish, note, torch_on_a_gpu  # noqa: E402

torch = torch_on_a_gpu()

import expanse  # noqa: E402
import expanse.torch  # noqa: E402

t0 = time.perf_counter()
alloc = expanse.torch.use(native=True)  # an error here (no compiler, build failure) fails the run
print(f"native allocator {alloc} installed in {time.perf_counter() - t0:.1f} s")
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("expanse driver:", expanse.driver_description())
# What the build chose and from which environment: run_on_gpu.sh clears every variable that could
# steer it, so a record can say the native allocator builds out of the box.
from torch.utils import cpp_extension  # noqa: E402
print("native build:", expanse.torch.choose_cuda_headers(torch, cpp_extension))
_STEERING = ("CUDA_HOME", "CUDA_PATH", "CPATH", "CPLUS_INCLUDE_PATH", "CXX", "EXPANSE_INCLUDE",
             "EXPANSE_TORCH_BUILD_DIR")
_set = [f"{v}={os.environ[v]}" for v in _STEERING if os.environ.get(v)]
print("build environment:", ", ".join(_set) if _set else f"none of {', '.join(_STEERING)} set")


def through_expanse():
    before = expanse.memory_stats()["allocation.all.allocated"]
    x = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
    after = expanse.memory_stats()["allocation.all.allocated"]
    assert after == before + 1, (before, after)
    del x
    assert expanse.torch.native_in_use()
    return f"a tensor's storage came from expanse ({after} allocations so far)"


def cudnn_benchmark_training():
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert all(l == l for l in losses), losses  # no NaN
    assert losses[-1] < losses[0], losses
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f} with cudnn.benchmark"


def memory_stats_equal_expanses():
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (4096, 300 << 10, 7 << 20)]
    torch.cuda.synchronize()
    t = torch.cuda.memory_stats()
    e = expanse.memory_stats()
    pairs = [("allocated_bytes.all.current", "allocated_bytes.all.current"),
             ("allocated_bytes.all.peak", "allocated_bytes.all.peak"),
             ("requested_bytes.all.current", "requested_bytes.all.current"),
             ("requested_bytes.all.peak", "requested_bytes.all.peak"),
             ("reserved_bytes.all.current", "reserved_bytes.all.current"),
             ("reserved_bytes.all.peak", "reserved_bytes.all.peak"),
             ("allocation.all.current", "allocation.all.current"),
             ("allocation.all.allocated", "allocation.all.allocated"),
             ("allocation.all.freed", "allocation.all.freed"),
             ("num_ooms", "num_ooms"),
             ("num_device_alloc", "num_device_alloc")]
    bad = [(k, t.get(k), e[j]) for k, j in pairs if t.get(k) != e[j]]
    assert not bad, bad
    assert torch.cuda.memory_allocated() == e["allocated_bytes.all.current"]
    assert torch.cuda.memory_reserved() == e["reserved_bytes.all.current"]
    # Pools add up.
    for f in ("allocated_bytes", "reserved_bytes", "allocation", "requested_bytes"):
        assert t[f"{f}.all.current"] == t[f"{f}.small_pool.current"] + \
            t[f"{f}.large_pool.current"], f
    torch.cuda.reset_peak_memory_stats()
    t2 = torch.cuda.memory_stats()
    assert t2["allocated_bytes.all.peak"] == t2["allocated_bytes.all.current"], t2
    del keep
    return f"{len(pairs)} figures equal; summary has {len(torch.cuda.memory_summary())} chars"


def snapshot_for_memory_viz():
    torch.cuda.memory._record_memory_history(max_entries=100000)
    xs = [torch.randn(1 << 18, device="cuda") for _ in range(8)]
    del xs[::2]
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    segs = snap["segments"]
    assert segs and all(s["blocks"] for s in segs), snap.keys()
    states = {b["state"] for s in segs for b in s["blocks"]}
    assert "active_allocated" in states, states
    trace = snap["device_traces"][0]
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed"} <= actions, actions
    framed = sum(1 for s in segs for b in s["blocks"] if b.get("frames"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            dumped = pickle.load(f)
        from torch.cuda import _memory_viz
        html = _memory_viz.trace_plot(dumped)
        text = _memory_viz.segsum(dumped)
    del xs
    return (f"{len(segs)} segments, {len(trace)} trace entries, {framed} blocks with stack "
            f"frames; memory_viz drew {len(html)} bytes of HTML, segsum {len(text)} chars")


def oom_is_out_of_memory_error():
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
    ooms = torch.cuda.memory_stats()["num_ooms"]
    _, total = torch.cuda.mem_get_info()
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        raise AssertionError("no OOM")
    except torch.cuda.OutOfMemoryError as e:
        msg = str(e)
    assert msg.startswith("CUDA out of memory. Tried to allocate"), msg
    assert "expanse" in msg, msg
    assert torch.cuda.memory_stats()["num_ooms"] == ooms + 1
    assert seen, "the OOM observer was not called"
    y = torch.ones(1 << 20, device="cuda")
    assert float(y.sum()) == float(1 << 20)
    return msg[:160]


def record_stream_under_a_long_kernel():
    side = torch.cuda.Stream()
    n = 64 << 20
    x = torch.zeros(n, dtype=torch.uint8, device="cuda")  # allocated on the default stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(5e8))  # ~0.3 s of GPU time before the side stream writes x
        x.fill_(1)
    x.record_stream(side)
    ptr = x.data_ptr()
    del x  # freed on the default stream while the side stream still has to write it
    y = torch.full((n,), 2, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    ok = bool((y == 2).all())
    assert ok, "the side stream's late write landed in memory reused after record_stream"
    return f"reused the address: {y.data_ptr() == ptr}; no late write seen"


def empty_cache_gives_back():
    xs = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del xs
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after < before, (before, after)
    return f"reserved {before >> 20} MiB -> {after >> 20} MiB"


def memory_fraction_is_a_limit():
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        assert abs(torch.cuda.get_per_process_memory_fraction() - 0.25) < 0.01 \
            if hasattr(torch.cuda, "get_per_process_memory_fraction") else True
        try:
            torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
            raise AssertionError("no OOM above the fraction")
        except torch.cuda.OutOfMemoryError as e:
            assert "limit" in str(e), str(e)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    z = torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    del z
    return "0.25 of the GPU caps expanse; 1.0 lifts the cap"


def pool_of(t):
    """The expanse pool of a tensor's block (0: the default pool)."""
    import ctypes
    out = ctypes.c_ulonglong(0)
    rc = expanse.library().expanse_pool_of(ctypes.c_void_p(t.data_ptr()), ctypes.byref(out))
    assert rc == 0, expanse.library().expanse_last_error()
    return out.value


def graph_freeing_in_capture_replays_like_eager():
    # A capture that frees tensors (tmp, tmp2), then eager allocations between replays: with a
    # private pool they never get the graph's memory, so every replay equals the eager result
    # (what PyTorch's own allocator gives), and the eager tensors keep their values.
    x = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as PyTorch's docs do before a capture
        for _ in range(2):
            ((x * 2) + 1).sin()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = x * 2
        tmp2 = tmp + 1
        del tmp
        out = tmp2.sin() * 3
        del tmp2
    assert pool_of(out) != 0, "the graph's output is not in an expanse pool"
    assert pool_of(x) == 0
    assert torch._C._cuda_checkPoolLiveAllocations(0, g.pool(), {out.data_ptr()})
    for i in range(5):
        new = torch.randn(1 << 20, device="cuda")
        x.copy_(new)
        before = [torch.full((1 << 18,), 7.0, device="cuda") for _ in range(8)]
        g.replay()
        after = [torch.full((1 << 18,), -1.0, device="cuda") for _ in range(8)]
        expect = ((new * 2) + 1).sin() * 3
        torch.cuda.synchronize()
        assert torch.equal(out, expect), f"replay {i} differs from eager"
        assert all(bool((b == 7.0).all()) for b in before), "a replay wrote an eager tensor"
        assert all(bool((a == -1.0).all()) for a in after)
    pid = pool_of(out)
    del g  # releasePool
    torch.cuda.empty_cache()
    assert float(out.sum()) == float(out.sum())  # the output stays valid
    return f"5 replays equal eager; the graph's pool is expanse pool {pid}"


def shared_pool_handle_and_graphed_callables():
    h = torch.cuda.graph_pool_handle()
    x = torch.randn(1 << 16, device="cuda")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=h):
        y1 = x * 2
    with torch.cuda.graph(g2, pool=h):
        y2 = y1 + 1
    assert pool_of(y1) == pool_of(y2) != 0, "two graphs of one handle: one pool"
    for _ in range(3):
        x.normal_()
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.equal(y2, x * 2 + 1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = model.cuda()
    ref = [p.detach().clone() for p in model.parameters()]
    sample = torch.randn(16, 64, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    inp = torch.randn(16, 64, device="cuda")
    out = graphed(inp)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    eager = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda()
    with torch.no_grad():
        for p, r in zip(eager.parameters(), ref):
            p.copy_(r)
    e_out = eager(inp)
    e_out.sum().backward()
    assert torch.allclose(out, e_out, atol=1e-5)
    for g, p in zip(grads, eager.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5)
    return "two graphs share a handle's pool; make_graphed_callables matches eager (out, grads)"


def mempool_and_use_mem_pool():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(1 << 20, device="cuda")
    b = torch.empty(1 << 20, device="cuda")
    assert pool_of(a) != 0 and pool_of(b) == 0
    assert pool.use_count() == 1, pool.use_count()
    assert torch._C._cuda_checkPoolLiveAllocations(0, pool.id, {a.data_ptr()})
    del a
    assert torch._C._cuda_checkPoolLiveAllocations(0, pool.id, set())
    del pool  # releasePool + emptyCache(id)
    torch.cuda.empty_cache()
    return "use_mem_pool's allocations are in an expanse pool, others not"


def reduce_overhead_without_trees():
    import torch._inductor.config as ic
    ic.triton.cudagraph_trees = False
    try:
        f = torch.compile(lambda t: (t * 2).sin() + 1, mode="reduce-overhead")
        t = torch.randn(1 << 12, device="cuda")
        for _ in range(3):
            r = f(t)
        assert torch.allclose(r, (t * 2).sin() + 1)
    finally:
        ic.triton.cudagraph_trees = True
    return "works"


check("tensor storage comes from expanse (native)", through_expanse)
check("a training loop with torch.backends.cudnn.benchmark = True", cudnn_benchmark_training)
check("torch.cuda.memory_stats() equals expanse's own stats", memory_stats_equal_expanses)
check("torch.cuda.memory._snapshot() / _dump_snapshot() read by memory_viz",
      snapshot_for_memory_viz)
check("an OOM is torch.cuda.OutOfMemoryError; the observer hears it", oom_is_out_of_memory_error)
check("record_stream across streams under a long kernel", record_stream_under_a_long_kernel)
check("torch.cuda.empty_cache() gives memory back", empty_cache_gives_back)
check("set_per_process_memory_fraction caps expanse", memory_fraction_is_a_limit)
check("a graph that frees in its capture replays like eager beside eager allocations",
      graph_freeing_in_capture_replays_like_eager)
check("graph_pool_handle() shared by two graphs; make_graphed_callables",
      shared_pool_handle_and_graphed_callables)
check("torch.cuda.MemPool + use_mem_pool", mempool_and_use_mem_pool)
note("torch.compile(mode='reduce-overhead') with cudagraph_trees = False",
     reduce_overhead_without_trees)
note("torch.compile(mode='reduce-overhead') with cudagraph trees (expected to raise)",
     lambda: torch.compile(lambda t: t * 2, mode="reduce-overhead")(
         torch.ones(8, device="cuda")).sum().item())

finish()
