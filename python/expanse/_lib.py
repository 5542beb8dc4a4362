"""Finding and loading libexpanse.so, and the C declarations the package calls through ctypes."""
import ctypes
import ctypes.util
import os

# Error codes of expanse.h.
OK, EINVAL, ENOMEM, EDRIVER, EBUSY = 0, 1, 2, 3, 4


class ExpanseError(RuntimeError):
    """A call into libexpanse failed; the message is expanse_last_error()."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


# C types as expanse_stats_field_type spells them.
_C_TYPES = {"size_t": ctypes.c_size_t, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
            "double": ctypes.c_double}


def _ctype(spelling):
    """The ctypes type of "uint64_t", or of an array such as "uint64_t[64]"."""
    base, bracket, length = spelling.partition("[")
    if base not in _C_TYPES or (bracket and not length.endswith("]")):
        raise ExpanseError(f"expanse: libexpanse describes a stats field as {spelling!r}, "
                           "which this package does not know; is it older than the library?")
    return _C_TYPES[base] * int(length[:-1]) if bracket else _C_TYPES[base]


def _stats_struct(lib):
    """expanse_stats laid out as the loaded library lays it out, from its own list of fields
    (expanse/stats_fields.h): one class per library, never a copy of the list to keep in step."""
    fields = []
    while True:
        name = lib.expanse_stats_field_name(len(fields))
        if name is None:
            break
        fields.append((name.decode(), _ctype(lib.expanse_stats_field_type(len(fields)).decode())))
    return type("Stats", (ctypes.Structure,), {
        "__doc__": "expanse_stats of the loaded libexpanse, field for field.", "_fields_": fields})


class PoolStats(ctypes.Structure):
    """expanse_pool_stats (expanse.h)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("id", ctypes.c_uint64),
                ("device", ctypes.c_int32), ("use_count", ctypes.c_int32),
                ("released", ctypes.c_uint32), ("returned", ctypes.c_uint32),
                ("live_blocks", ctypes.c_uint64), ("requested_bytes", ctypes.c_uint64),
                ("live_bytes", ctypes.c_uint64), ("cached_bytes", ctypes.c_uint64),
                ("physical_bytes", ctypes.c_uint64), ("asleep", ctypes.c_uint32),
                ("reserved0", ctypes.c_uint32), ("host_backup_bytes", ctypes.c_uint64),
                ("sleeps", ctypes.c_uint64), ("released_bytes", ctypes.c_uint64),
                ("sleep_ns", ctypes.c_uint64), ("wake_ns", ctypes.c_uint64),
                ("sleep_modeled_ns", ctypes.c_uint64), ("wake_modeled_ns", ctypes.c_uint64)]


# int filter(stream, ctx) of expanse_pool_begin_filter.
POOL_FILTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def _candidates():
    env = os.environ.get("EXPANSE_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    # First the package's own copy: a pip-installed wheel carries libexpanse.so in the package.
    out = [os.path.join(here, name) for name in ("libexpanse.so", "libexpanse.so.0")]
    try:
        from . import _installed  # written by `cmake --install`
        out.append(_installed.LIBRARY)
    except ImportError:
        pass
    for name in ("libexpanse.so", "libexpanse.so.0"):
        out.append(name)  # the loader path (LD_LIBRARY_PATH, ld.so.cache)
    found = ctypes.util.find_library("expanse")
    if found:
        out.append(found)
    return out, False


_lib = None
_path = None
_stats = None  # the Stats class of _lib


class IpcHandle(ctypes.Structure):
    """expanse_ipc_handle: 128 opaque bytes (expanse.h, "Sharing across processes")."""
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


def _declare(lib):
    global _stats
    c = ctypes
    for name in ("expanse_stats_field_name", "expanse_stats_field_type"):
        getattr(lib, name).restype = c.c_char_p
        getattr(lib, name).argtypes = [c.c_int]
    _stats = _stats_struct(lib)
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
        "expanse_reserve": (c.c_int, [c.c_int, c.c_size_t, c.POINTER(c.c_size_t)]),
        "expanse_unreserve": (c.c_int, [c.c_int]),
        "expanse_get_stats": (c.c_int, [c.c_int, c.POINTER(_stats)]),
        "expanse_reset_peak_stats": (c.c_int, [c.c_int]),
        "expanse_entry_point_name": (c.c_char_p, [c.c_int]),
        "expanse_last_error": (c.c_char_p, []),
        "expanse_init": (c.c_int, [c.c_char_p]),
        "expanse_shutdown": (c.c_int, []),
        "expanse_driver_description": (c.c_char_p, []),
        "expanse_device_count": (c.c_int, []),
        "expanse_record_history": (c.c_int, [c.c_int, c.c_size_t]),
        "expanse_dump_snapshot": (c.c_int, [c.c_char_p]),
        "expanse_pool_create": (c.c_int, [c.c_int, c.POINTER(c.c_ulonglong)]),
        "expanse_pool_create_registrable": (c.c_int, [c.c_int, c.POINTER(c.c_ulonglong)]),
        "expanse_ipc_export": (c.c_int, [c.c_void_p, c.POINTER(IpcHandle)]),
        "expanse_ipc_send": (c.c_int, [c.c_int, c.POINTER(IpcHandle)]),
        "expanse_ipc_recv": (c.c_int, [c.c_int, c.POINTER(IpcHandle)]),
        "expanse_ipc_import": (c.c_int, [c.POINTER(IpcHandle), c.c_int,
                                         c.POINTER(c.c_void_p)]),
        "expanse_ipc_close": (c.c_int, [c.c_void_p]),
        "expanse_ipc_handle_release": (c.c_int, [c.POINTER(IpcHandle)]),
        "expanse_ipc_handle_size": (c.c_size_t, [c.POINTER(IpcHandle)]),
        "expanse_pool_retain": (c.c_int, [c.c_ulonglong]),
        "expanse_pool_release": (c.c_int, [c.c_ulonglong]),
        "expanse_pool_begin_capture": (c.c_int, [c.c_ulonglong, stream]),
        "expanse_pool_begin_thread": (c.c_int, [c.c_ulonglong]),
        "expanse_pool_begin_filter": (c.c_int, [c.c_ulonglong, POOL_FILTER, c.c_void_p]),
        "expanse_pool_end": (c.c_int, [c.c_ulonglong]),
        "expanse_pool_malloc": (c.c_void_p, [c.c_ulonglong, c.c_size_t, stream]),
        "expanse_pool_trim": (c.c_int, [c.c_ulonglong]),
        "expanse_pool_get_stats": (c.c_int, [c.c_ulonglong, c.POINTER(PoolStats)]),
        "expanse_pool_of": (c.c_int, [c.c_void_p, c.POINTER(c.c_ulonglong)]),
        "expanse_pool_sleep": (c.c_int, [c.c_ulonglong, c.c_int, stream]),
        "expanse_pool_wake": (c.c_int, [c.c_ulonglong, stream]),
        "expanse_pool_is_asleep": (c.c_int, [c.c_ulonglong]),
        "expanse_release_host_backup": (c.c_int, [c.c_int]),
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
    how = ("EXPANSE_LIBRARY" if explicit else
           "in the package, where cmake --install put it, then on the loader path")
    raise ExpanseError(f"expanse: cannot load libexpanse.so ({how}): " + "; ".join(errors))


def stats_type():
    """The ctypes class of expanse_stats for the loaded library (loading it if needed)."""
    library()
    return _stats


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
