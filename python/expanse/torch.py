"""expanse as PyTorch's CUDA allocator.

    import expanse.torch
    expanse.torch.use()          # before the first CUDA tensor
    x = torch.empty(..., device="cuda")   # allocated by expanse

An OOM raises RuntimeError("CUDA out of memory. Tried to allocate ..."). Statistics, empty_cache
and snapshots of expanse's memory are in the expanse module (expanse.memory_stats(), ...):
torch.cuda.memory_stats() and friends do not support a pluggable allocator.
"""
import expanse as _expanse

MALLOC = "expanse_torch_malloc"
FREE = "expanse_torch_free"

_allocator = None


def use(conf=None):
    """Makes expanse PyTorch's CUDA allocator (CUDAPluggableAllocator with expanse_torch_malloc /
    expanse_torch_free). conf: an EXPANSE_CONF-style string applied first (None: EXPANSE_CONF).
    Must run before PyTorch allocates CUDA memory; raises RuntimeError otherwise. Calling it
    again once in use does nothing (and fails if conf would change the configuration)."""
    global _allocator
    import torch  # noqa: F401  (ImportError names the missing dependency)
    from torch.cuda import memory as tmem

    if _allocator is not None:
        if conf is not None:
            raise RuntimeError("expanse.torch.use(conf): expanse is already PyTorch's allocator; "
                               "the configuration can no longer change")
        return _allocator
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "expanse.torch.use(): PyTorch has already initialized CUDA (and with it its own "
            "caching allocator); PyTorch can switch allocators only before that. Call "
            "expanse.torch.use() before the first CUDA tensor or torch.cuda call that "
            "initializes CUDA.")
    if conf is not None:
        _expanse.init(conf)
    path = _expanse.library_path()
    allocator = tmem.CUDAPluggableAllocator(path, MALLOC, FREE)
    tmem.change_current_allocator(allocator)
    _allocator = allocator
    return allocator


def in_use():
    """True once use() has made expanse PyTorch's allocator in this process."""
    return _allocator is not None
