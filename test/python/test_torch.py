"""expanse.torch: with real PyTorch + CUDA where importable (skipped otherwise, with the reason),
and the logic of use() against a stand-in torch module everywhere."""
import sys
import types

import pytest

import expanse
from conftest import SIM


def _torch_with_cuda():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, f"PyTorch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return None, "PyTorch is installed but CUDA is not available"
    return torch, ""


# ---- against a stand-in for torch: what use() asks of PyTorch ---------------------------------

class FakeTorch:
    def __init__(self, initialized=False):
        self.calls = []
        self.initialized = initialized
        fake = self

        class CUDAPluggableAllocator:
            def __init__(self, path, alloc, free):
                fake.calls.append(("CUDAPluggableAllocator", path, alloc, free))

        self.module = types.ModuleType("torch")
        self.module.cuda = types.ModuleType("torch.cuda")
        self.module.cuda.is_initialized = lambda: fake.initialized
        self.module.cuda.is_available = lambda: False
        mem = types.ModuleType("torch.cuda.memory")
        mem.CUDAPluggableAllocator = CUDAPluggableAllocator
        mem.change_current_allocator = lambda a: fake.calls.append(("change", a))
        self.module.cuda.memory = mem

        class Stream:
            cuda_stream = 0x5000

        class CUDAGraph:  # what torch.cuda.graph calls
            fail_begin = False

            def capture_begin(self, pool=None, capture_error_mode="global"):
                fake.calls.append(("capture_begin", capture_error_mode))
                if self.fail_begin:
                    raise RuntimeError("capture_begin failed")

            def capture_end(self):
                fake.calls.append(("capture_end",))

        self.module.cuda.CUDAGraph = CUDAGraph
        self.module.cuda.current_stream = lambda: Stream()
        self.modules = {"torch": self.module, "torch.cuda": self.module.cuda,
                        "torch.cuda.memory": mem}


@pytest.fixture
def fake_torch(monkeypatch, ex):
    import expanse.torch as et
    monkeypatch.setattr(et, "_allocator", None)
    fake = FakeTorch()
    for name, mod in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return fake, et


def test_use_installs_the_torch_entry_points(fake_torch):
    fake, et = fake_torch
    alloc = et.use(SIM)
    assert fake.calls[0] == ("CUDAPluggableAllocator", expanse.library_path(),
                             "expanse_torch_malloc", "expanse_torch_free")
    assert fake.calls[1] == ("change", alloc)
    assert et.in_use()
    assert et.use() is alloc  # idempotent
    with pytest.raises(RuntimeError, match="can no longer change"):
        et.use(SIM)


def test_use_from_two_threads_at_once_installs_once(fake_torch, monkeypatch):
    import threading
    import time
    fake, et = fake_torch
    slow = fake.module.cuda.memory.CUDAPluggableAllocator

    class SlowAllocator(slow):  # keeps the first caller inside use() while the second arrives
        def __init__(self, *args):
            time.sleep(0.2)
            super().__init__(*args)

    monkeypatch.setattr(fake.module.cuda.memory, "CUDAPluggableAllocator", SlowAllocator)
    start = threading.Barrier(2)
    got, errors = [], []

    def call():
        start.wait()
        try:
            got.append(et.use(native=False))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [c[0] for c in fake.calls].count("change") == 1
    assert len(got) == 2 and got[0] is got[1]


def test_use_refuses_after_cuda_is_initialized(fake_torch):
    fake, et = fake_torch
    fake.initialized = True
    with pytest.raises(RuntimeError, match="already initialized CUDA"):
        et.use()
    assert fake.calls == []
    assert not et.in_use()


def test_use_applies_conf_first(fake_torch):
    _, et = fake_torch
    with pytest.raises(expanse.ExpanseError, match="bogus"):
        et.use("driver:sim,bogus:1")
    assert not et.in_use()
    expanse.init(SIM)


def test_graph_captures_are_announced_around_begin_and_end(fake_torch, monkeypatch):
    fake, et = fake_torch
    monkeypatch.setattr(expanse, "capture_begin",
                        lambda s=None: fake.calls.append(("announce", s.cuda_stream)))
    monkeypatch.setattr(expanse, "capture_end",
                        lambda s=None: fake.calls.append(("unannounce", s.cuda_stream)))
    et.use(SIM)
    del fake.calls[:2]
    g = fake.module.cuda.CUDAGraph()
    g.capture_begin(capture_error_mode="thread_local")
    assert fake.calls == [("announce", 0x5000), ("capture_begin", "thread_local")]
    g.capture_end()
    assert fake.calls[2:] == [("capture_end",), ("unannounce", 0x5000)]
    g.capture_end()  # a second end announces nothing more
    assert fake.calls[-1] == ("capture_end",)
    # A begin that fails takes its announcement back; nothing is left announced.
    del fake.calls[:]
    g.fail_begin = True
    with pytest.raises(RuntimeError, match="capture_begin failed"):
        g.capture_begin()
    assert fake.calls == [("announce", 0x5000), ("capture_begin", "global"),
                          ("unannounce", 0x5000)]
    # use() wraps the methods once.
    et._announce_graph_captures(fake.module)
    del fake.calls[:]
    g.fail_begin = False
    g.capture_begin()
    assert [c[0] for c in fake.calls] == ["announce", "capture_begin"]
    g.capture_end()


def test_capture_announcement_without_a_context_names_the_problem(ex):
    # The test thread has no CUDA context current: NULL names no capture context.
    with pytest.raises(expanse.ExpanseError, match="current context"):
        expanse.capture_begin()
    with pytest.raises(TypeError, match="cuda_stream"):
        expanse.capture_begin("stream 1")


# ---- real PyTorch with CUDA ---------------------------------------------------------------------

def test_real_torch_training_loop_oom_and_snapshot(tmp_path):
    torch, why = _torch_with_cuda()
    if torch is None:
        pytest.skip(why)
    import subprocess
    import os
    # A fresh process: the allocator can be switched only before CUDA is initialized.
    script = tmp_path / "run.py"
    script.write_text(TORCH_SCRIPT)
    env = dict(os.environ, EXPANSE_CONF=os.environ.get("EXPANSE_TORCH_CONF", "driver:cuda"))
    # The package from this checkout, as the test process imports it (installed or not).
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(expanse.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "snap.pickle")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OOM-OK" in out.stdout, out.stdout


TORCH_SCRIPT = r'''
import pickle, sys
import torch
import expanse, expanse.torch
expanse.torch.use()
expanse.record_history(True)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
try:
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    raise SystemExit("no OOM")
except RuntimeError as e:
    assert str(e).startswith("CUDA out of memory. Tried to allocate"), str(e)
    print("OOM-OK", type(e).__name__, str(e)[:200])
y = torch.ones(1 << 20, device="cuda")
assert float(y.sum()) == float(1 << 20)
expanse.dump_snapshot(sys.argv[1])
snap = pickle.load(open(sys.argv[1], "rb"))
print("stats", expanse.memory_stats()["allocated_bytes.all.peak"],
      "trace entries", len(snap["device_traces"][0]))
'''


def test_use_reserve_adds_the_conf_key(fake_torch, monkeypatch):
    _, et = fake_torch
    assert et._reserve_conf(SIM, 0.9) == SIM + ",reserve:0.9"
    assert et._reserve_conf(SIM, "free") == SIM + ",reserve:free"
    assert et._reserve_conf(SIM, 1 << 30) == SIM + f",reserve:{1 << 30}"
    monkeypatch.setenv("EXPANSE_CONF", "driver:sim")
    assert et._reserve_conf(None, "40GiB") == "driver:sim,reserve:40GiB"
    with pytest.raises(ValueError):
        et._reserve_conf(SIM, 2.0)
    with pytest.raises(TypeError):
        et._reserve_conf(SIM, True)


def test_use_reserve_holds_memory_from_the_first_allocation(fake_torch):
    _, et = fake_torch
    et.use(SIM, native=False, reserve="256MiB")
    lib = expanse.library()
    p = lib.expanse_malloc(1 << 20, 0, None)
    assert p
    s = expanse.memory_stats()
    assert s["expanse.reserved_bytes"] == 256 << 20
    assert s["expanse.physical_bytes"] == 256 << 20
    lib.expanse_free(p, 1 << 20, 0, None)
