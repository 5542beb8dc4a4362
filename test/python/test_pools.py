"""expanse.Pool, use_pool and graph_pool, against the sim."""
import threading

import pytest

import expanse
from conftest import MiB


def test_pool_lifecycle_and_stats(ex, lib):
    with expanse.Pool(0) as p:
        assert p.id > 0
        s = p.stats()
        assert s["id"] == p.id and s["device"] == 0 and s["use_count"] == 1
        assert s["released"] is False and s["returned"] is False
        a = p.malloc(3 * MiB + 1)
        assert a
        s = p.stats()
        assert s["live_blocks"] == 1
        assert s["requested_bytes"] == 3 * MiB + 1
        assert s["live_bytes"] == 3 * MiB + 512
        assert s["physical_bytes"] >= 4 * MiB
        lib.expanse_free(a, 3 * MiB + 1, 0, None)
        assert p.stats()["cached_bytes"] == 4 * MiB  # a pool takes whole 2 MiB pages
    s = p.stats()
    assert s["released"] is True and s["use_count"] == 0
    expanse.empty_cache()
    assert p.stats()["returned"] is True
    p.release()  # a second release does nothing


def test_use_pool_routes_this_thread_only(ex, lib):
    p = expanse.Pool()
    other = []
    with expanse.use_pool(p):
        a = lib.expanse_malloc(MiB, 0, None)
        t = threading.Thread(target=lambda: other.append(lib.expanse_malloc(MiB, 0, None)))
        t.start()
        t.join()
        assert p.stats()["live_blocks"] == 1
    b = lib.expanse_malloc(MiB, 0, None)
    assert p.stats()["live_blocks"] == 1
    for x in (a, b, other[0]):
        lib.expanse_free(x, MiB, 0, None)
    p.release()


def test_errors_name_the_pool(ex):
    p = expanse.Pool()
    p.release()
    with pytest.raises(expanse.ExpanseError, match=f"pool {p.id}.*released"):
        with expanse.use_pool(p):
            pass
    with pytest.raises(expanse.ExpanseError, match=f"pool {p.id}"):
        p.retain()
    with pytest.raises(expanse.ExpanseError, match="pool 123456789 does not exist"):
        expanse.use_pool(123456789).__enter__()
    q = expanse.Pool()
    with pytest.raises(expanse.ExpanseError, match=f"pool {q.id} routes nothing"):
        expanse.use_pool(q).__exit__(None, None, None)
    with pytest.raises(expanse.ExpanseError, match="in use"):
        q.trim()
    q.release()
    assert q.trim() is True


class FakeTorchStream:
    def __init__(self, handle):
        self.cuda_stream = handle


def test_graph_pool_takes_torch_style_streams(ex):
    p = expanse.Pool()
    # Not a stream the driver knows: the error names the stream, and nothing routes.
    with pytest.raises(expanse.ExpanseError, match="0xdead000"):
        with expanse.graph_pool(p, FakeTorchStream(0xDEAD000)):
            pass
    with pytest.raises(TypeError):
        expanse.graph_pool(p, "stream")
    with pytest.raises(expanse.ExpanseError, match="routes nothing"):
        expanse.graph_pool(p, 0xDEAD000).__exit__(None, None, None)
    p.release()


def test_sleep_gives_the_pages_back_and_wake_brings_the_bytes_back(ex, lib):
    import ctypes
    with expanse.Pool(0) as p:
        a = p.malloc(3 * MiB)
        ctypes.memset(a, 0x5A, 3 * MiB)
        ctypes.memset(a + MiB, 0xC3, 4096)
        held = p.stats()["physical_bytes"]
        assert held >= 3 * MiB
        assert p.sleep(offload=True) is True
        s = p.stats()
        assert s["asleep"] is True and p.asleep
        assert s["physical_bytes"] == 0 and s["host_backup_bytes"] >= 3 * MiB
        with pytest.raises(expanse.ExpanseError, match="asleep"):
            p.malloc(MiB)
        p.wake()
        assert not p.asleep
        assert ctypes.string_at(a, 16) == b"\x5a" * 16
        assert ctypes.string_at(a + MiB, 4096) == b"\xc3" * 4096
        assert ctypes.string_at(a + 3 * MiB - 16, 16) == b"\x5a" * 16
        lib.expanse_free(a, 3 * MiB, 0, None)
    expanse.release_host_backup()


def test_discard_with_zero_on_wake_and_the_sleep_figures(ex, lib):
    import ctypes
    with expanse.Pool(0) as p:
        a = p.malloc(3 * MiB)
        ctypes.memset(a, 0x5A, 3 * MiB)
        held = p.stats()["physical_bytes"]
        with pytest.raises(ValueError, match="zero_on_wake"):
            p.sleep(offload=True, zero_on_wake=True)
        assert p.sleep(offload=False, zero_on_wake=True) is True
        s = p.stats()
        assert s["sleeps"] == 1 and s["released_bytes"] == held
        assert s["sleep_modeled_ns"] > 0 and s["host_backup_bytes"] == 0
        p.wake()
        assert p.stats()["wake_modeled_ns"] > 0
        assert ctypes.string_at(a, 3 * MiB) == bytes(3 * MiB)
        lib.expanse_free(a, 3 * MiB, 0, None)


def test_torch_style_tagged_sleep_and_wake(ex, lib):
    """expanse.torch.use_memory_pool / sleep / wake_up, as a vLLM-style engine uses them (no torch
    needed: the thread's allocations are routed the same way for expanse_malloc)."""
    import ctypes
    import expanse.torch as et
    with et.use_memory_pool("weights", device=0) as wp:
        w = lib.expanse_malloc(2 * MiB, 0, None)
    with et.use_memory_pool("kv_cache", device=0) as kp:
        k = lib.expanse_malloc(4 * MiB, 0, None)
    outside = lib.expanse_malloc(MiB, 0, None)
    assert wp.stats()["live_blocks"] == 1 and kp.stats()["live_blocks"] == 1
    ctypes.memset(w, 0x7E, 2 * MiB)
    et.sleep(offload_tags=("weights",))
    assert wp.asleep and kp.asleep
    assert wp.stats()["physical_bytes"] == 0 and kp.stats()["physical_bytes"] == 0
    et.wake_up(tags="weights")
    assert not wp.asleep and kp.asleep
    assert ctypes.string_at(w, 64) == b"\x7e" * 64
    et.wake_up()
    assert not kp.asleep
    ctypes.memset(k, 0, 4 * MiB)
    for p in (w, k, outside):
        lib.expanse_free(p, 0, 0, None)
