"""Sharing expanse blocks with other processes (expanse_ipc_*; docs/api.md, "Sharing across
processes").

    pool = expanse.Pool(0, registrable=True)      # blocks of a registrable pool can be shared
    p = pool.malloc(n)
    h = expanse.ipc.export(p)                     # in the exporter
    expanse.ipc.send(sock, h); h.release()        # sock: a connected AF_UNIX socket (or its fd)
    ...
    h = expanse.ipc.recv(sock)                    # in the importer
    q = expanse.ipc.open(h, device=0); h.release()
    ...
    expanse.ipc.close(q)

Pointers are ints. torch.multiprocessing's CUDA tensor sharing does not go through this yet.
"""
import ctypes
import weakref

from ._lib import IpcHandle, check, library

__all__ = ["Handle", "export", "send", "recv", "open", "close"]


def _release_quietly(h):
    library().expanse_ipc_handle_release(ctypes.byref(h))


def _fd(sock):
    return sock if isinstance(sock, int) else sock.fileno()


class Handle:
    """An expanse_ipc_handle and the fds it holds in this process (release() closes them; a
    handle never released closes them when it is collected)."""

    def __init__(self):
        self._h = IpcHandle()
        # Holds the record, not self: closing the fds twice is harmless.
        self._finalizer = weakref.finalize(self, _release_quietly, self._h)

    @property
    def size(self):
        """The block's size as exported, 0 once released."""
        return library().expanse_ipc_handle_size(ctypes.byref(self._h))

    def release(self):
        check(library().expanse_ipc_handle_release(ctypes.byref(self._h)),
              "expanse.ipc.Handle.release()")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def export(ptr):
    """A Handle for the live registrable block starting at ptr."""
    h = Handle()
    check(library().expanse_ipc_export(ctypes.c_void_p(ptr), ctypes.byref(h._h)),
          f"expanse.ipc.export({ptr:#x})")
    return h


def send(sock, handle):
    check(library().expanse_ipc_send(_fd(sock), ctypes.byref(handle._h)), "expanse.ipc.send()")


def recv(sock):
    h = Handle()
    check(library().expanse_ipc_recv(_fd(sock), ctypes.byref(h._h)), "expanse.ipc.recv()")
    return h


def open(handle, device=0):  # noqa: A001 (the verb of the C API: import is a keyword)
    """Maps the handle's block on device; its address in this process (an int)."""
    out = ctypes.c_void_p(0)
    check(library().expanse_ipc_import(ctypes.byref(handle._h), device, ctypes.byref(out)),
          f"expanse.ipc.open(device={device})")
    return out.value


def close(ptr):
    """Unmaps an address open() returned, after the device's work is done."""
    check(library().expanse_ipc_close(ctypes.c_void_p(ptr)), f"expanse.ipc.close({ptr:#x})")
