"""Loads libexpanse.so the way torch.cuda.memory.CUDAPluggableAllocator does and calls the two
functions with PyTorch's C signatures; runs without PyTorch and without a GPU (on the sim).

    EXPANSE_CONF=driver:sim python3 pluggable_abi_ctypes.py [path/to/libexpanse.so]

CUDAPluggableAllocator(path, "expanse_malloc", "expanse_free") does ctypes.CDLL(path), takes the
two symbols' addresses and hands them to PyTorch's C++ side, which calls
    void* alloc(size_t size, int device, cudaStream_t stream)
    void  free(void* ptr, size_t size, int device, cudaStream_t stream)
with the current device and stream, freeing with the size, device and stream of the allocation.
"""
import ctypes
import os
import random
import sys

from expanse_ctypes import Expanse

path = sys.argv[1] if len(sys.argv) > 1 else "libexpanse.so"
os.environ.setdefault("EXPANSE_CONF", "driver:sim,sim_capacity:2GiB")

# What CUDAPluggableAllocator.__init__ does: load the library, resolve both names to addresses.
lib = ctypes.CDLL(path)
alloc_addr = ctypes.cast(getattr(lib, "expanse_malloc"), ctypes.c_void_p).value
free_addr = ctypes.cast(getattr(lib, "expanse_free"), ctypes.c_void_p).value

# PyTorch's C++ function types, called through the raw addresses as PyTorch does.
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
alloc = ALLOC_FN(alloc_addr)
free = FREE_FN(free_addr)

ex = Expanse(path)  # the same library instance: stats, release_cached
print("driver:", ex.driver())

# A few "training steps": activations of varying batch sizes, weights that live throughout.
device, stream = 0, None  # None: the legacy default stream (PyTorch's default)
weights = [(alloc(n, device, stream), n) for n in (4 << 20, 16 << 20, 1 << 20)]
assert all(p for p, _ in weights), ex.last_error()
rng = random.Random(7)
for step in range(50):
    batch = rng.choice([8, 16, 24, 32, 48])
    acts = [(alloc(batch * n, device, stream), batch * n) for n in (4096, 65536, 1000, 300000)]
    assert all(p for p, _ in acts), f"step {step}: {ex.last_error()}"
    ctypes.memset(acts[0][0], 0, acts[0][1])  # sim memory is host memory (not so on a GPU)
    for p, n in reversed(acts):
        free(p, n, device, stream)

s = ex.stats(device)
print(f"after 50 steps: live {s.live_blocks} blocks, {s.requested_bytes} B requested, "
      f"peak {s.peak_requested_bytes} B requested / {s.peak_mapped_bytes} B mapped, "
      f"{s.num_allocs} allocs")
assert s.live_blocks == len(weights)

# Out of memory: NULL (PyTorch raises torch.OutOfMemoryError), never a crash.
assert alloc(1 << 40, device, stream) is None
print("1 TiB request:", ex.last_error().splitlines()[0])
assert alloc(0, device, stream) is None  # zero bytes: NULL, no error

for p, n in weights:
    free(p, n, device, stream)
ex.release_cached(device)  # torch.cuda.empty_cache() would not reach expanse
s = ex.stats(device)
print(f"after release_cached: {s.mapped_bytes} B mapped, {s.physical_bytes} B held")
assert s.live_blocks == 0 and s.physical_bytes == 0
print("ok")
