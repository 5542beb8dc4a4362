"""What PyTorch users get with expanse.torch.use(), checked on a real GPU (docs/integrations.md's
"What works, and what does not" table): each check prints ok / FAIL / note and the script exits 1
if any check failed, 77 (skipped) without PyTorch or a GPU.

    EXPANSE_LIBRARY=build/lib/libexpanse.so PYTHONPATH=python python3 test/python/torch_gpu_checks.py

Every check runs in this one process (the allocator can be switched only once, before CUDA is
initialized); a check that breaks CUDA (a fault is sticky) would fail the ones after it, so the
order goes from safe to risky.
"""
import os
import pathlib
import pickle
import sys
import tempfile
import time

from gpu_check_harness import check, finish, note, torch_on_a_gpu  # noqa: E402

torch = torch_on_a_gpu()

import expanse  # noqa: E402
import expanse.torch  # noqa: E402

# The pluggable pair (what this script documents); test/gpu/torch_native_checks.py checks the
# native allocator.
expanse.torch.use(native=False)
expanse.record_history(True)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("expanse driver:", expanse.driver_description())


def through_expanse():
    before = expanse.memory_stats()["allocation.all.allocated"]
    x = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
    after = expanse.memory_stats()["allocation.all.allocated"]
    assert after == before + 1, (before, after)
    del x
    return f"a tensor's storage came from expanse ({after} allocations so far)"


def training_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(30):
        batch = [64, 512, 1024, 128, 768][step % 5]  # shapes that vary, as in serving
        x = torch.randn(batch, 1024, device="cuda")
        loss = (model(x) - x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(l == l for l in losses), "NaN loss"
    assert losses[-1] < losses[0], (losses[0], losses[-1])
    s = expanse.memory_stats()
    return (f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; peak {s['allocated_bytes.all.peak'] >> 20} MiB "
            f"allocated, {s['reserved_bytes.all.peak'] >> 20} MiB reserved")


def matches_cpu():
    torch.manual_seed(1)
    a = torch.randn(2048, 2048)
    b = torch.randn(2048, 2048)
    got = (a.cuda() @ b.cuda()).cpu()
    want = a @ b
    err = (got - want).abs().max().item()
    assert err < 1e-2, err
    return f"max |gpu - cpu| = {err:.2e}"


def oom_is_runtime_error():
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    except RuntimeError as e:
        msg = str(e)
        assert msg.startswith("CUDA out of memory. Tried to allocate"), msg[:200]
        y = torch.ones(1 << 20, device="cuda")  # and the allocator still works
        assert y.sum().item() == float(1 << 20)
        return f"{type(e).__name__}: {msg.splitlines()[0][:120]}"
    raise AssertionError("an allocation of twice the GPU's memory succeeded")


def big_contiguous_after_fragmenting():
    # Fragment: many tensors, free every other one, then ask for one block bigger than any hole.
    free_b, total = torch.cuda.mem_get_info()
    chunk = 256 << 20
    n = int(free_b * 0.6) // chunk
    keep = [torch.empty(chunk, dtype=torch.uint8, device="cuda") for _ in range(n)]
    for i in range(0, n, 2):
        keep[i] = None
    big = torch.empty((n // 2) * chunk, dtype=torch.uint8, device="cuda")
    big.fill_(7)
    assert big[-1].item() == 7
    del big, keep
    return f"{n} x 256 MiB, half freed, then one {(n // 2) * chunk >> 20} MiB tensor"


def side_stream_with_wait_stream():
    # The documented pattern without record_stream: the consumer stream waits, then the producer
    # frees; the next tensor on the producer must not be clobbered by the consumer's late work.
    s = torch.cuda.Stream()
    x = torch.zeros(32 << 20, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(2e8))  # ~100 ms of GPU time on the side stream
        x.fill_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    del x
    y = torch.empty(32 << 20, device="cuda")
    y.fill_(2.0)
    torch.cuda.synchronize()
    assert (y == 2.0).all().item()
    return "a freed tensor's late side-stream writes did not reach the next tensor"


def memory_stats_raise():
    try:
        torch.cuda.memory_stats()
    except RuntimeError as e:
        return f"raises as documented: {str(e).splitlines()[0][:100]}"
    return "torch.cuda.memory_stats() works (docs say it raises: update them)"


def torch_compile():
    f = torch.compile(lambda a, b: torch.nn.functional.gelu(a @ b) + 1)
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    got = f(a, b)
    want = torch.nn.functional.gelu(a @ b) + 1
    err = (got - want).abs().max().item()
    assert err < 1e-2, err
    return f"torch.compile (default mode) on expanse memory, max err {err:.1e}"


def snapshot_reads_with_memory_viz():
    from torch.cuda import _memory_viz as mv
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        expanse.dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
    # segsum reads the segments; trace_plot and segment_plot embed the snapshot for the viewer
    # (memory() and segments() draw flame graphs with a script they download: not offline).
    out = []
    text = mv.segsum(snap)
    assert isinstance(text, str) and text, "segsum returned nothing"
    out.append(f"segsum {len(text)} chars")
    for fn_name in ("trace_plot", "segment_plot"):
        fn = getattr(mv, fn_name, None)
        if fn is None:
            continue
        html = fn(snap)
        assert isinstance(html, str) and len(html) > 1000, fn_name
        out.append(f"{fn_name} {len(html)} chars")
    return "torch.cuda._memory_viz read it: " + ", ".join(out)


def empty_cache_gives_back():
    expanse.empty_cache()
    s = expanse.memory_stats()
    free_b, total = torch.cuda.mem_get_info()
    return (f"after expanse.empty_cache(): {s['reserved_bytes.all.current'] >> 20} MiB reserved, "
            f"cudaMemGetInfo free {free_b >> 20} of {total >> 20} MiB")


check("tensor storage comes from expanse", through_expanse)
check("GPU matmul on expanse memory matches the CPU", matches_cpu)
check("a training loop with varying shapes converges", training_loop)
check("OOM is PyTorch's RuntimeError, allocator still works", oom_is_runtime_error)
check("a contiguous tensor larger than every hole fits", big_contiguous_after_fragmenting)
check("side stream + wait_stream: no late write into reused memory", side_stream_with_wait_stream)
check("torch.cuda.memory_stats() with a pluggable allocator", memory_stats_raise)
check("torch.compile without CUDA graphs", torch_compile)
check("expanse's snapshot reads with torch.cuda._memory_viz", snapshot_reads_with_memory_viz)
check("expanse.empty_cache()", empty_cache_gives_back)
note("torch.cuda.empty_cache()", lambda: (torch.cuda.empty_cache(), "returns")[1])
note("tensor.record_stream(s)",
     lambda: (torch.ones(4, device="cuda").record_stream(torch.cuda.Stream()), "returns")[1])
note("torch.backends.cudnn.benchmark conv", lambda: (
    setattr(torch.backends.cudnn, "benchmark", True),
    torch.nn.functional.conv2d(torch.randn(8, 3, 64, 64, device="cuda"),
                               torch.randn(16, 3, 3, 3, device="cuda")).sum().item(),
    setattr(torch.backends.cudnn, "benchmark", False), "works")[-1])


def _warmed_input():
    """A tensor, with x * 2 run once on a side stream first (PyTorch's graph docs ask for it)."""
    x = torch.ones(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x * 2
    torch.cuda.current_stream().wait_stream(s)
    return x


def cuda_graph_mode(mode):
    def run():
        g = torch.cuda.CUDAGraph()
        x = _warmed_input()
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = x * 2 + 1
        g.replay()
        torch.cuda.synchronize()
        return f"captured and replayed; y[0] = {y[0].item()}"
    return run


def cuda_graph_beside_empty_cache():
    # Another thread allocates, frees and empties expanse's cache (which synchronizes the context
    # when it must) while this thread captures: expanse.torch.use() announced the capture, so
    # no such sync runs and the capture stays valid (an H100 showed the unannounced failure).
    import threading
    g = torch.cuda.CUDAGraph()
    x = _warmed_input()
    stop = threading.Event()
    rounds = [0]

    def other():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            while not stop.is_set():
                t = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
                del t
                expanse.empty_cache()
                rounds[0] += 1

    th = threading.Thread(target=other)
    th.start()
    time.sleep(0.05)
    try:
        with torch.cuda.graph(g):
            for _ in range(8):
                y = x * 2 + 1
                time.sleep(0.005)
    finally:
        stop.set()
        th.join()
    g.replay()
    torch.cuda.synchronize()
    assert y[0].item() == 3.0, y[0].item()
    return f"captured and replayed beside {rounds[0]} empty_cache() calls"


note("torch.cuda.graph (documented unsupported: private pools)", cuda_graph_mode("global"))
check("torch.cuda.graph while another thread empties the cache", cuda_graph_beside_empty_cache)
for mode in ("thread_local", "relaxed"):
    note(f"torch.cuda.graph capture_error_mode={mode}", cuda_graph_mode(mode))
torch.cuda.synchronize()
finish()
