"""expanse as PyTorch's CUDA allocator.

    import expanse.torch
    expanse.torch.use()          # before the first CUDA tensor
    x = torch.empty(..., device="cuda")   # allocated by expanse

An OOM raises RuntimeError("CUDA out of memory. Tried to allocate ..."). torch.cuda.graph
captures are announced to expanse (see expanse.capture_begin), so that no expanse call from
another thread invalidates them. Statistics, empty_cache and snapshots of expanse's memory are in
the expanse module (expanse.memory_stats(), ...): torch.cuda.memory_stats() and friends do not
support a pluggable allocator.
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
    _announce_graph_captures(torch)
    _allocator = allocator
    return allocator


def _announce_graph_captures(torch):
    """Makes torch.cuda.CUDAGraph announce its captures to expanse (expanse.capture_begin before
    the capture begins, capture_end after it ended): a context synchronize from any thread while
    a stream captures invalidates the capture, and only the announcement tells expanse not to
    run one. PyTorch gives a pluggable allocator no capture hooks from Python, so the methods
    torch.cuda.graph calls are wrapped (once)."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or getattr(graph, "_expanse_announces", False):
        return
    begin, end = graph.capture_begin, graph.capture_end

    def capture_begin(self, *args, **kwargs):
        # CUDAGraph captures on the current stream; the announcement names its context.
        stream = torch.cuda.current_stream()
        _expanse.capture_begin(stream)
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            _expanse.capture_end(stream)
            raise
        self._expanse_capture_stream = stream

    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            stream = getattr(self, "_expanse_capture_stream", None)
            if stream is not None:
                self._expanse_capture_stream = None
                _expanse.capture_end(stream)

    graph.capture_begin = capture_begin
    graph.capture_end = capture_end
    graph._expanse_announces = True


def in_use():
    """True once use() has made expanse PyTorch's allocator in this process."""
    return _allocator is not None
