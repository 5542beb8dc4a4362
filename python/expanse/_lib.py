"""Finding and loading libexpanse.so, and the C declarations the package calls through ctypes."""
import ctypes
import ctypes.util
import os

_MAX_ENTRY_POINTS = 64

# Error codes of expanse.h.
OK, EINVAL, ENOMEM, EDRIVER = 0, 1, 2, 3


class ExpanseError(RuntimeError):
    """A call into libexpanse failed; the message is expanse_last_error()."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class Stats(ctypes.Structure):
    """expanse_stats of expanse.h, field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("requested_bytes", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("touched_bytes", ctypes.c_uint64),
        ("mapped_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("pooled_bytes", ctypes.c_uint64),
        ("physical_bytes", ctypes.c_uint64),
        ("va_reserved_bytes", ctypes.c_uint64),
        ("peak_requested_bytes", ctypes.c_uint64),
        ("peak_allocated_bytes", ctypes.c_uint64),
        ("peak_mapped_bytes", ctypes.c_uint64),
        ("peak_physical_bytes", ctypes.c_uint64),
        ("peak_va_reserved_bytes", ctypes.c_uint64),
        ("live_blocks", ctypes.c_uint64),
        ("num_allocs", ctypes.c_uint64),
        ("num_frees", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
        ("num_reclaimed_pages", ctypes.c_uint64),
        ("num_created_pages", ctypes.c_uint64),
        ("num_released_pages", ctypes.c_uint64),
        ("driver_calls_total", ctypes.c_uint64),
        ("modeled_driver_seconds", ctypes.c_double),
        ("page_size", ctypes.c_uint64),
        ("capacity_bytes", ctypes.c_uint64),
        ("limit_bytes", ctypes.c_uint64),
        ("num_entry_points", ctypes.c_uint32),
        ("driver_calls", ctypes.c_uint64 * _MAX_ENTRY_POINTS),
        ("num_free_size_mismatches", ctypes.c_uint64),
        ("num_unknown_frees", ctypes.c_uint64),
    ]


def _candidates():
    env = os.environ.get("EXPANSE_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    try:
        from . import _installed  # written by `cmake --install`
        out.append(_installed.LIBRARY)
    except ImportError:
        pass
    for name in ("libexpanse.so", "libexpanse.so.0"):
        out.append(os.path.join(here, name))
    for name in ("libexpanse.so", "libexpanse.so.0"):
        out.append(name)  # the loader path (LD_LIBRARY_PATH, ld.so.cache)
    found = ctypes.util.find_library("expanse")
    if found:
        out.append(found)
    return out, False


_lib = None
_path = None


def _declare(lib):
    c = ctypes
    stream = c.c_void_p
    sigs = {
        "expanse_malloc": (c.c_void_p, [c.c_size_t, c.c_int, stream]),
        "expanse_free": (None, [c.c_void_p, c.c_size_t, c.c_int, stream]),
        "expanse_free_checked": (c.c_int, [c.c_void_p, c.c_size_t, c.c_int, stream]),
        "expanse_record_stream": (c.c_int, [c.c_void_p, stream]),
        "expanse_release_cached": (c.c_int, [c.c_int]),
        "expanse_capture_begin": (c.c_int, [stream]),
        "expanse_capture_end": (c.c_int, [stream]),
        "expanse_set_limit": (c.c_int, [c.c_int, c.c_size_t]),
        "expanse_get_stats": (c.c_int, [c.c_int, c.POINTER(Stats)]),
        "expanse_reset_peak_stats": (c.c_int, [c.c_int]),
        "expanse_entry_point_name": (c.c_char_p, [c.c_int]),
        "expanse_last_error": (c.c_char_p, []),
        "expanse_init": (c.c_int, [c.c_char_p]),
        "expanse_shutdown": (c.c_int, []),
        "expanse_driver_description": (c.c_char_p, []),
        "expanse_device_count": (c.c_int, []),
        "expanse_record_history": (c.c_int, [c.c_int, c.c_size_t]),
        "expanse_dump_snapshot": (c.c_int, [c.c_char_p]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    # expanse_torch_malloc throws C++ exceptions: it is only ever called by PyTorch, never
    # through ctypes (an exception cannot cross ctypes' C frames).
    return lib


def library():
    """The loaded libexpanse (a ctypes.CDLL). Raises ExpanseError naming every place tried."""
    global _lib, _path
    if _lib is not None:
        return _lib
    names, explicit = _candidates()
    errors = []
    for name in names:
        if os.sep in name and not os.path.exists(name):
            errors.append(f"{name}: no such file")
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        _path = name
        _lib = _declare(lib)
        return _lib
    how = "EXPANSE_LIBRARY" if explicit else "next to the package, then on the loader path"
    raise ExpanseError(f"expanse: cannot load libexpanse.so ({how}): " + "; ".join(errors))


def library_path():
    """The path libexpanse was loaded from (loading it if needed)."""
    library()
    if os.sep in _path:
        return os.path.abspath(_path)
    # Found on the loader path: ask the loader where.
    import ctypes as c
    info = _DlInfo()
    libdl = c.CDLL(None)
    sym = c.cast(_lib.expanse_malloc, c.c_void_p)
    if libdl.dladdr(sym, c.byref(info)) and info.dli_fname:
        return os.path.abspath(info.dli_fname.decode())
    return _path


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def last_error():
    return library().expanse_last_error().decode(errors="replace")


def check(code, what):
    if code != OK:
        raise ExpanseError(f"{what}: {last_error()}", code)
