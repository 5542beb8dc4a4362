"""Every function of the expanse package, against the sim."""
import ctypes
import os
import pickle
import random
import subprocess

import pytest

import expanse
from conftest import GiB, MiB, SIM


def test_library_is_the_one_ctest_names(ex):
    want = os.environ.get("EXPANSE_LIBRARY")
    if want:
        assert os.path.realpath(expanse.library_path()) == os.path.realpath(want)
    assert expanse.driver_description().startswith("sim:")
    assert expanse.device_count() == 1


def test_memory_stats_follow_allocations(ex, lib):
    p = lib.expanse_malloc(3 * MiB + 1, 0, None)
    q = lib.expanse_malloc(1000, 0, None)
    assert p and q
    s = expanse.memory_stats()
    assert s["requested_bytes.all.current"] == 3 * MiB + 1 + 1000
    assert s["allocated_bytes.all.current"] == 3 * MiB + 512 + 1024
    assert s["allocation.all.current"] == 2
    assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
    assert s["reserved_bytes.all.current"] == s["expanse.physical_bytes"]
    assert s["expanse.capacity_bytes"] == GiB
    assert s["expanse.limit_bytes"] is None
    assert s["expanse.driver_calls.cuMemMap"] >= 1
    lib.expanse_free(p, 3 * MiB + 1, 0, None)
    lib.expanse_free(q, 1000, 0, None)
    s = expanse.memory_stats(0)
    assert s["allocated_bytes.all.current"] == 0
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 512 + 1024
    assert s["allocation.all.freed"] == 2


def test_stats_struct_is_laid_out_from_the_librarys_list(ex, lib):
    stats = expanse._lib.stats_type()
    names = [name for name, _ in stats._fields_]
    assert names[:2] == ["struct_size", "requested_bytes"]
    assert lib.expanse_stats_field_name(len(names)) is None
    # Offered more room than the class takes, the library answers with its own sizeof.
    room = (ctypes.c_char * (ctypes.sizeof(stats) + 64))()
    s = stats.from_buffer(room)
    s.struct_size = len(room)
    assert lib.expanse_get_stats(0, ctypes.byref(s)) == 0
    assert s.struct_size == ctypes.sizeof(stats)
    listed = {k[len("expanse."):] for k in expanse.memory_stats()
              if k.startswith("expanse.") and not k.startswith("expanse.driver_calls.")}
    assert listed == set(names) - {"struct_size", "driver_calls", "num_entry_points"}


def test_device_arguments(ex):
    assert expanse.memory_stats("cuda:0") == expanse.memory_stats(0) == expanse.memory_stats()
    with pytest.raises(expanse.ExpanseError, match="device 3 does not exist"):
        expanse.memory_stats(3)


def test_memory_summary_names_the_figures(ex, lib):
    p = lib.expanse_malloc(5 * MiB, 0, None)
    text = expanse.memory_summary()
    assert "Allocated memory" in text and "5.00 MiB" in text
    assert "Live blocks 1" in text
    assert "Live blocks" not in expanse.memory_summary(abbreviated=True)
    lib.expanse_free(p, 5 * MiB, 0, None)


def test_empty_cache_releases_cached_pages(ex, lib):
    p = lib.expanse_malloc(64 * MiB, 0, None)
    lib.expanse_free(p, 64 * MiB, 0, None)
    assert expanse.memory_stats()["reserved_bytes.all.current"] >= 64 * MiB
    expanse.empty_cache()
    s = expanse.memory_stats()
    assert s["reserved_bytes.all.current"] == 0
    assert s["expanse.num_released_pages"] >= 32


def test_set_limit_bytes_fraction_and_none(ex, lib):
    expanse.set_limit(256 * MiB)
    assert expanse.memory_stats()["expanse.limit_bytes"] == 256 * MiB
    assert lib.expanse_malloc(300 * MiB, 0, None) is None
    assert "limit" in expanse._lib.last_error()
    expanse.set_limit(0.5)
    assert expanse.memory_stats()["expanse.limit_bytes"] == GiB // 2
    p = lib.expanse_malloc(300 * MiB, 0, None)
    assert p
    lib.expanse_free(p, 300 * MiB, 0, None)
    expanse.set_limit(None)
    assert expanse.memory_stats()["expanse.limit_bytes"] is None
    with pytest.raises(ValueError):
        expanse.set_limit(1.5)
    with pytest.raises(ValueError):
        expanse.set_limit(-1)
    with pytest.raises(TypeError):
        expanse.set_limit("1GiB")


def test_reset_peak_stats(ex, lib):
    p = lib.expanse_malloc(8 * MiB, 0, None)
    lib.expanse_free(p, 8 * MiB, 0, None)
    assert expanse.memory_stats()["requested_bytes.all.peak"] == 8 * MiB
    expanse.reset_peak_stats()
    assert expanse.memory_stats()["requested_bytes.all.peak"] == 0


def test_errors_carry_expanse_last_error(ex):
    with pytest.raises(expanse.ExpanseError, match="bogus"):
        expanse.init("driver:sim,bogus:1")
    expanse.init(SIM)
    with pytest.raises(expanse.ExpanseError, match="cannot open"):
        expanse.dump_snapshot("/nonexistent-dir/x.pickle")
    with pytest.raises(ValueError):
        expanse.record_history(True, max_entries=-1)


def test_shutdown_and_reinit(ex):
    expanse.shutdown()
    expanse.init(SIM)
    assert expanse.device_count() == 1


# ---- snapshots --------------------------------------------------------------------------------

def run_sequence(lib, rng, steps, sizes):
    """Random allocs and frees; returns (peak live requested bytes, live {addr: size})."""
    live = {}
    cur = peak = 0
    for _ in range(steps):
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            size = live.pop(addr)
            lib.expanse_free(addr, size, 0, None)
            cur -= size
        else:
            size = rng.choice(sizes)
            p = lib.expanse_malloc(size, 0, None)
            if p is None:
                continue
            live[p] = size
            cur += size
            peak = max(peak, cur)
    return peak, live


def replay_json(path):
    cli = os.environ.get("EXPANSE_CLI")
    if not cli:
        pytest.skip("EXPANSE_CLI (the expanse binary) is not set")
    out = subprocess.run([cli, "replay", str(path), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout)


def check_structure(snap, live):
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"}
    active = {}
    for seg in snap["segments"]:
        assert set(seg) == seg_keys
        assert seg["segment_type"] in ("small", "large")
        addr = seg["address"]
        for b in seg["blocks"]:  # blocks tile their segment
            assert set(b) == {"address", "size", "requested_size", "state", "frames"}
            assert b["address"] == addr
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            if b["state"] == "active_allocated":
                active[b["address"]] = b["requested_size"]
            addr += b["size"]
        assert addr == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"]
                                            if b["state"] == "active_allocated")
        assert seg["requested_size"] == sum(active.get(b["address"], 0) for b in seg["blocks"])
    assert active == live
    for e in snap["device_traces"][0]:
        assert e["action"] in ("alloc", "free_requested", "free_completed", "segment_map",
                               "segment_unmap", "oom")
        assert {"action", "size", "stream", "time_us", "frames"} <= set(e)
        assert ("device_free" if e["action"] == "oom" else "addr") in e


def test_snapshot_structure_and_replay_peak(ex, lib, tmp_path):
    rng = random.Random(9)
    expanse.record_history(True)
    peak, live = run_sequence(lib, rng, 400, [1000, 4096, 300 * 1024, 3 * MiB + 7, 24 * MiB])
    assert lib.expanse_malloc(4 * GiB, 0, None) is None  # an oom entry
    expanse.empty_cache()  # segment_unmap entries
    path = tmp_path / "snap.pickle"
    expanse.dump_snapshot(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    check_structure(snap, live)
    actions = [e["action"] for e in snap["device_traces"][0]]
    for a in ("alloc", "free_requested", "free_completed", "segment_map", "segment_unmap", "oom"):
        assert a in actions, a
    oom = [e for e in snap["device_traces"][0] if e["action"] == "oom"][0]
    assert oom["size"] == 4 * GiB

    # The trace replays to exactly the live set at the end, and its mapped ranges to the
    # segments (recording began on an empty device).
    cur, mapped = {}, set()
    page = expanse.memory_stats()["expanse.page_size"]
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            assert e["addr"] not in cur
            cur[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            assert cur.pop(e["addr"]) == e["size"]
        elif e["action"] == "segment_map":
            new = set(range(e["addr"], e["addr"] + e["size"], page))
            assert not (mapped & new)
            mapped |= new
        elif e["action"] == "segment_unmap":
            gone = set(range(e["addr"], e["addr"] + e["size"], page))
            assert gone <= mapped
            mapped -= gone
    assert cur == live
    assert mapped == {a for s in snap["segments"]
                      for a in range(s["address"], s["address"] + s["total_size"], page)}

    report = replay_json(path)
    assert report["peak_live_bytes"] == peak
    assert report["allocs"] == sum(1 for a in actions if a == "alloc")
    for addr, size in live.items():
        lib.expanse_free(addr, size, 0, None)


def test_record_history_ring_keeps_the_last_entries(ex, lib, tmp_path):
    expanse.record_history(True, max_entries=10)
    for _ in range(20):
        p = lib.expanse_malloc(4096, 0, None)
        lib.expanse_free(p, 4096, 0, None)
    expanse.record_history(False)  # stopping keeps the trace
    p = lib.expanse_malloc(4096, 0, None)  # not recorded
    expanse.dump_snapshot(tmp_path / "s.pickle")
    snap = pickle.load(open(tmp_path / "s.pickle", "rb"))
    trace = snap["device_traces"][0]
    assert len(trace) == 10
    assert trace[-1]["action"] == "free_completed"
    lib.expanse_free(p, 4096, 0, None)
    expanse.record_history(True)  # a new trace
    expanse.dump_snapshot(tmp_path / "t.pickle")
    assert pickle.load(open(tmp_path / "t.pickle", "rb"))["device_traces"][0] == []


def test_snapshot_without_recording_has_segments_only(ex, lib, tmp_path):
    p = lib.expanse_malloc(2 * MiB, 0, None)
    expanse.dump_snapshot(tmp_path / "s.pickle")
    snap = pickle.load(open(tmp_path / "s.pickle", "rb"))
    assert snap["device_traces"] == [[]]
    check_structure(snap, {p: 2 * MiB})
    lib.expanse_free(p, 2 * MiB, 0, None)


def test_big_addresses_and_long_lists_round_trip(ex, lib, tmp_path):
    # More than one APPENDS batch (1000 entries) in a list.
    expanse.record_history(True)
    ptrs = [lib.expanse_malloc(512, 0, None) for _ in range(1500)]
    for p in ptrs:
        lib.expanse_free(p, 512, 0, None)
    expanse.dump_snapshot(tmp_path / "s.pickle")
    trace = pickle.load(open(tmp_path / "s.pickle", "rb"))["device_traces"][0]
    assert [e["addr"] for e in trace if e["action"] == "alloc"] == ptrs
    assert len([e for e in trace if e["action"] == "free_completed"]) == 1500


def test_reserve_holds_memory_that_empty_cache_keeps(ex, lib):
    assert expanse.reserve(0.5) == GiB // 2
    s = expanse.memory_stats()
    assert s["expanse.reserved_bytes"] == GiB // 2
    assert s["expanse.reserved_unused_bytes"] == GiB // 2
    assert s["reserved_bytes.all.current"] == GiB // 2
    p = lib.expanse_malloc(300 * MiB, 0, None)
    assert p
    s = expanse.memory_stats()
    assert s["expanse.physical_bytes"] == GiB // 2  # served by the reservation, nothing beyond it
    assert s["expanse.reserved_unused_bytes"] < GiB // 2
    lib.expanse_free(p, 300 * MiB, 0, None)
    expanse.empty_cache()
    s = expanse.memory_stats()
    assert s["expanse.physical_bytes"] == GiB // 2
    # The reservation never dipped, and no block took reserved handles whole.
    assert s["expanse.physical_low_water_bytes"] == GiB // 2
    assert s["expanse.reserve_stranded_bytes"] == 0
    assert "Reserved, unused" in expanse.memory_summary()
    expanse.unreserve()
    assert expanse.memory_stats()["expanse.physical_bytes"] == 0
    assert expanse.reserve("free") == GiB - 512 * MiB  # less the default margin
    expanse.reserve(None)
    with pytest.raises(ValueError):
        expanse.reserve(1.5)
    with pytest.raises(TypeError):
        expanse.reserve("1GiB")


def test_reserve_more_than_the_device_names_the_problem(ex):
    with pytest.raises(expanse.ExpanseError, match="more than the device"):
        expanse.reserve(2 * GiB)
    assert expanse.memory_stats()["expanse.physical_bytes"] == 0


def test_reserve_from_the_conf_at_first_use(ex, lib):
    expanse.init(SIM + ",reserve:256MiB")
    assert expanse.memory_stats()["expanse.reserved_bytes"] == 0  # device not used yet
    p = lib.expanse_malloc(MiB, 0, None)
    assert expanse.memory_stats()["expanse.reserved_bytes"] == 256 * MiB
    lib.expanse_free(p, MiB, 0, None)
    expanse.init(SIM)
