"""expanse.ipc: a registrable pool's block shared with a child process over a socketpair."""
import ctypes
import os
import socket
import subprocess
import sys

import pytest

import expanse
from conftest import HERE, MiB, SIM


# The child: a fresh interpreter (a child forked from a process that initialized CUDA may not use
# the driver before exec), handed the socket's fd number in argv.
CHILD = """
import ctypes, socket, sys
sys.path.insert(0, sys.argv[2])
import expanse
expanse.init(sys.argv[3])
sock = socket.socket(fileno=int(sys.argv[1]))
got = expanse.ipc.recv(sock)
n = got.size
q = expanse.ipc.open(got, device=0)
got.release()
ok = ctypes.string_at(q, n) == bytes(i % 251 for i in range(n))
ctypes.memset(q, 0x5A, n)
expanse.ipc.close(q)
sock.sendall(b"k")
sys.exit(0 if ok else 2)
"""


def test_child_process_imports_checks_and_writes(ex, lib):
    pool = expanse.Pool(0, registrable=True)
    n = 3 * MiB + 5
    p = pool.malloc(n)
    ctypes.memmove(p, bytes(i % 251 for i in range(n)), n)
    h = expanse.ipc.export(p)
    assert h.size == n
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    package = os.path.join(HERE, "..", "..", "python")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(child.fileno()), package, SIM],
        pass_fds=(child.fileno(),))
    child.close()
    expanse.ipc.send(parent, h)
    h.release()
    assert parent.recv(1) == b"k"
    assert proc.wait(timeout=120) == 0
    parent.close()
    assert ctypes.string_at(p, n) == b"\x5a" * n
    lib.expanse_free(p, n, 0, None)
    pool.release()


def test_plain_pool_blocks_cannot_be_exported(ex, lib):
    with expanse.Pool(0) as pool:
        p = pool.malloc(MiB)
        with pytest.raises(expanse.ExpanseError, match="registrable"):
            expanse.ipc.export(p)
        lib.expanse_free(p, MiB, 0, None)


def test_a_collected_handle_closes_its_fds(ex, lib):
    import gc
    pool = expanse.Pool(0, registrable=True)
    p = pool.malloc(MiB)
    expanse.ipc.export(p).release()  # the sim keeps a memfd per exported allocation from here
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        h = expanse.ipc.export(p)
        assert h.size == MiB
        del h
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before, "collected handles kept their fds"
    lib.expanse_free(p, MiB, 0, None)
    pool.release()
