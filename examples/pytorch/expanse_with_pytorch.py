"""PyTorch with expanse as its CUDA allocator: a small training loop with varying batch sizes,
an OOM caught as PyTorch reports it, and a memory snapshot.

    EXPANSE_CONF=driver:cuda PYTHONPATH=python python3 expanse_with_pytorch.py [libexpanse.so]

Needs PyTorch with CUDA and a GPU; without them it exits with 77 (skipped). The allocator must be
switched before PyTorch allocates any CUDA memory.
"""
import os
import pathlib
import sys
import tempfile

SKIP = 77
if len(sys.argv) > 1:
    os.environ.setdefault("EXPANSE_LIBRARY", sys.argv[1])
os.environ.setdefault("EXPANSE_CONF", "driver:cuda")  # a GPU, never the sim's host memory
# The package from this checkout when it is not installed.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed")
    sys.exit(SKIP)
if not torch.cuda.is_available():
    print("SKIP: no CUDA GPU for PyTorch")
    sys.exit(SKIP)

import expanse  # noqa: E402
import expanse.torch  # noqa: E402

# ---- the switch: before the first CUDA tensor -------------------------------------------------
expanse.torch.use()
expanse.record_history(True)
# ------------------------------------------------------------------------------------------------
print("expanse driver:", expanse.driver_description())

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(20):
    batch = [64, 256, 1024, 128, 512][step % 5]  # varying shapes: what fragments caches
    x = torch.randn(batch, 1024, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()

s = expanse.memory_stats()
print(f"loss {loss.item():.4f}; expanse: {s['allocation.all.current']} live blocks, "
      f"{s['allocated_bytes.all.current'] / 2**20:.1f} MiB allocated, "
      f"peak {s['reserved_bytes.all.peak'] / 2**20:.1f} MiB reserved")
assert s["allocation.all.allocated"] > 0, "PyTorch did not allocate through expanse"

# An allocation larger than the GPU: PyTorch's own message, as a RuntimeError; later ones work.
total = torch.cuda.get_device_properties(0).total_memory
try:
    torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    raise AssertionError("an allocation of twice the GPU's memory succeeded")
except RuntimeError as e:
    assert str(e).startswith("CUDA out of memory. Tried to allocate"), str(e)
    print("OOM caught as RuntimeError:", str(e).splitlines()[0])
z = torch.ones(1024, device="cuda")
assert z.sum().item() == 1024

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "expanse_snapshot.pickle")
    expanse.dump_snapshot(path)
    print("snapshot:", os.path.getsize(path), "bytes (expanse replay / pytorch.org/memory_viz)")

del model, opt, x, y, loss, z
expanse.empty_cache()  # torch.cuda.empty_cache() does not reach a pluggable allocator
print("ok")
