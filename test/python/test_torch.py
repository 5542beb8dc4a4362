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
