"""ctypes access to libexpanse.so for Python programs (PyTorch users in particular).

PyTorch's CUDAPluggableAllocator only calls expanse_malloc and expanse_free. What PyTorch's own
allocator offers through torch.cuda (memory_stats, empty_cache, set_per_process_memory_fraction)
does not reach a pluggable allocator, so this module reaches expanse directly:

    ex = Expanse("libexpanse.so")      # the same path given to CUDAPluggableAllocator
    ex.stats(0).requested_bytes         # instead of torch.cuda.memory_allocated()
    ex.release_cached(0)                # instead of torch.cuda.empty_cache()
    ex.set_limit(0, 40 << 30)           # instead of set_per_process_memory_fraction()

ctypes.CDLL of the path PyTorch loaded gives the same library instance, so these see the memory
PyTorch allocated.
"""
import ctypes

EXPANSE_OK = 0


_C_TYPES = {"size_t": ctypes.c_size_t, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
            "double": ctypes.c_double}


def stats_struct(lib):
    """expanse_stats (include/expanse/expanse.h) as a ctypes class, laid out from the field names
    and C types the library lists ("uint64_t", "uint64_t[64]"), so it never falls out of step."""
    for f in (lib.expanse_stats_field_name, lib.expanse_stats_field_type):
        f.argtypes, f.restype = [ctypes.c_int], ctypes.c_char_p
    fields = []
    while (name := lib.expanse_stats_field_name(len(fields))) is not None:
        base, _, length = lib.expanse_stats_field_type(len(fields)).decode().partition("[")
        ctype = _C_TYPES[base] * int(length[:-1]) if length else _C_TYPES[base]
        fields.append((name.decode(), ctype))
    return type("Stats", (ctypes.Structure,), {"_fields_": fields})


class ExpanseError(RuntimeError):
    pass


class Expanse:
    def __init__(self, path="libexpanse.so"):
        self.path = path
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        self.Stats = stats_struct(lib)
        lib.expanse_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(self.Stats)]
        lib.expanse_get_stats.restype = ctypes.c_int
        lib.expanse_release_cached.argtypes = [ctypes.c_int]
        lib.expanse_release_cached.restype = ctypes.c_int
        lib.expanse_set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
        lib.expanse_set_limit.restype = ctypes.c_int
        lib.expanse_last_error.argtypes = []
        lib.expanse_last_error.restype = ctypes.c_char_p
        lib.expanse_driver_description.argtypes = []
        lib.expanse_driver_description.restype = ctypes.c_char_p
        lib.expanse_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.expanse_record_stream.restype = ctypes.c_int

    def _check(self, rc, what):
        if rc != EXPANSE_OK:
            raise ExpanseError(f"{what}: {self.last_error()}")

    def last_error(self):
        return (self.lib.expanse_last_error() or b"").decode()

    def driver(self):
        d = self.lib.expanse_driver_description()
        if d is None:
            raise ExpanseError(f"expanse_driver_description: {self.last_error()}")
        return d.decode()

    def stats(self, device=0):
        s = self.Stats()
        s.struct_size = ctypes.sizeof(self.Stats)
        self._check(self.lib.expanse_get_stats(device, ctypes.byref(s)), "expanse_get_stats")
        return s

    def release_cached(self, device=0):
        self._check(self.lib.expanse_release_cached(device), "expanse_release_cached")

    def set_limit(self, device, nbytes):
        self._check(self.lib.expanse_set_limit(device, nbytes), "expanse_set_limit")

    def record_stream(self, ptr, stream):
        """What tensor.record_stream(stream) would do with PyTorch's own allocator: ptr (a
        tensor's data_ptr()) is used on stream (torch.cuda.Stream.cuda_stream) as well."""
        self._check(self.lib.expanse_record_stream(ptr, stream), "expanse_record_stream")
