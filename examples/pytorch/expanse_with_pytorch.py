"""PyTorch with expanse as its CUDA allocator: a small training loop with varying batch sizes.

    EXPANSE_CONF=driver:cuda python3 expanse_with_pytorch.py [path/to/libexpanse.so]

Needs PyTorch with CUDA and a GPU; without them it exits with 77 (skipped). The allocator must be
switched before PyTorch allocates any CUDA memory.
"""
import os
import sys

SKIP = 77
path = sys.argv[1] if len(sys.argv) > 1 else "libexpanse.so"
os.environ.setdefault("EXPANSE_CONF", "driver:cuda")  # a GPU, never the sim's host memory

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed")
    sys.exit(SKIP)
if not torch.cuda.is_available():
    print("SKIP: no CUDA GPU for PyTorch")
    sys.exit(SKIP)

# ---- the switch: before the first CUDA tensor -------------------------------------------------
expanse_alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "expanse_malloc", "expanse_free")
torch.cuda.memory.change_current_allocator(expanse_alloc)
# ------------------------------------------------------------------------------------------------

from expanse_ctypes import Expanse  # noqa: E402  (stats and release_cached through ctypes)

ex = Expanse(path)
print("expanse driver:", ex.driver())

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

s = ex.stats(0)
print(f"loss {loss.item():.4f}; expanse: {s.live_blocks} live blocks, "
      f"{s.requested_bytes / 2**20:.1f} MiB requested, peak {s.peak_mapped_bytes / 2**20:.1f} MiB "
      f"mapped, {s.num_allocs} allocations")
assert s.num_allocs > 0 and s.live_blocks > 0, "PyTorch did not allocate through expanse"

del model, opt, x, y, loss
ex.release_cached(0)  # torch.cuda.empty_cache() does not reach a pluggable allocator
print("ok")
