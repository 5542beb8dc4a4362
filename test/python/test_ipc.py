"""expanse.ipc: a registrable pool's block shared with a forked child over a socketpair."""
import ctypes
import os
import socket

import pytest

import expanse
from conftest import MiB


def test_forked_child_imports_checks_and_writes(ex, lib):
    pool = expanse.Pool(0, registrable=True)
    n = 3 * MiB + 5
    p = pool.malloc(n)
    ctypes.memmove(p, bytes(i % 251 for i in range(n)), n)
    h = expanse.ipc.export(p)
    assert h.size == n
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the child: only this, then _exit
        code = 1
        try:
            parent.close()
            got = expanse.ipc.recv(child)
            q = expanse.ipc.open(got, device=0)
            got.release()
            ok = ctypes.string_at(q, n) == bytes(i % 251 for i in range(n))
            ctypes.memset(q, 0x5A, n)
            expanse.ipc.close(q)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    child.close()
    expanse.ipc.send(parent, h)
    h.release()
    _, status = os.waitpid(pid, 0)
    parent.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert ctypes.string_at(p, n) == b"\x5a" * n
    lib.expanse_free(p, n, 0, None)
    pool.release()


def test_plain_pool_blocks_cannot_be_exported(ex, lib):
    with expanse.Pool(0) as pool:
        p = pool.malloc(MiB)
        with pytest.raises(expanse.ExpanseError, match="registrable"):
            expanse.ipc.export(p)
        lib.expanse_free(p, MiB, 0, None)
