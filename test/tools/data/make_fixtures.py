#!/usr/bin/env python3
"""Regenerates the tiny pickles the tools tests read (CPython's own pickler is the reference
for what a snapshot pickle looks like). Run from this folder: python3 make_fixtures.py"""
import collections
import pickle


class Opaque:
    """Stands for a class the reader cannot know (pickled as STACK_GLOBAL + REDUCE)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __reduce__(self):
        return (Opaque, (self.a, self.b))


def snapshot():
    # Device 0: two segments; a block allocated before recording (0x1000, freed in the trace),
    # one still live at the end without a recorded alloc (0x9000), stream 0 and stream 77.
    frames = [{"name": "f", "filename": "x.py", "line": 1}]
    segments = [
        {"device": 0, "address": 0x1000, "total_size": 0x8000, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [], "blocks": [
             {"address": 0x1000, "size": 0x2000, "requested_size": 0x2000, "state": "inactive",
              "frames": []},
             {"address": 0x3000, "size": 0x1000, "requested_size": 4000,
              "state": "active_allocated", "frames": frames},
         ]},
        {"device": 0, "address": 0x9000, "total_size": 0x4000, "stream": 0,
         "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [], "blocks": [
             {"address": 0x9000, "size": 0x800, "requested_size": 0x800,
              "state": "active_allocated", "frames": []},
         ]},
    ]
    ev = lambda action, addr, size, stream=0: {"action": action, "addr": addr, "size": size,
                                                 "stream": stream, "time_us": 1, "frames": frames}
    trace = [
        ev("segment_alloc", 0x1000, 0x8000),
        ev("alloc", 0x2000, 0x1000),            # live 0x2000 + pre 0x1800 + 0x800
        ev("free_requested", 0x1000, 0x1800),
        ev("free_completed", 0x1000, 0x1800),   # allocated before recording began
        ev("alloc", 0x3000, 4000, 77),          # stream 77
        ev("alloc", 0x5000, 0x3000),            # peak: 0x1000 + 4000 + 0x3000 + 0x800
        ev("free_completed", 0x5000, 0x3000),
        ev("free_completed", 0x2000, 0x1000),
        ev("snapshot", 0, 0),
    ]
    return {"segments": segments, "device_traces": [trace, []]}


def variants():
    """What newer and older PyTorch versions add or leave out (see snapshot_compat_test.cpp):
    a C++ frame's line number 2**64 - 1 (a 9-byte LONG1), events without stream / time_us /
    frames, an OOM event (device_free, no addr), a user-defined event, a block waiting for its
    streams (active_pending_free), a segment whose blocks carry no address, allocator_settings,
    a second device."""
    frames = [{"name": "??", "filename": "??", "line": 2**64 - 1}]
    M = 1 << 20
    seg = lambda device, address, total, blocks: {
        "device": device, "address": address, "total_size": total, "allocated_size": 0,
        "active_size": 0, "requested_size": 0, "stream": 0,
        "segment_type": "large" if total > M else "small", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": frames, "blocks": blocks}
    blk = lambda size, state, address=None: dict(
        ({"address": address} if address is not None else {}), size=size, requested_size=size,
        state=state, frames=frames)
    segments = [
        seg(0, 0x100000, 2 * M, [blk(0x400, "inactive", 0x100000),
                                 blk(0x1000, "active_pending_free", 0x100400),
                                 blk(2 * M - 0x1400, "inactive", 0x101400)]),
        seg(0, 0x300000, 2 * M, [blk(0xc00, "active_allocated"), blk(0x800, "active_allocated"),
                                 blk(2 * M - 0x1400, "inactive")]),
        seg(1, 0x5000000, 20 * M, [blk(20 * M, "active_allocated", 0x5000000)]),
    ]
    ev = lambda action, addr, size, stream=0: {"action": action, "addr": addr, "size": size,
                                                 "stream": stream, "time_us": 1700000000000000,
                                                 "frames": frames}
    trace0 = [
        ev("segment_alloc", 0x100000, 2 * M),
        ev("alloc", 0x100000, 1000, 5),
        {"action": "alloc", "addr": 0x300000, "size": 3000},
        {"action": "oom", "device_free": 123, "size": 1 << 40, "stream": 0, "time_us": 1,
         "frames": frames},
        {"action": "user_defined", "name": "step"},
        ev("free_requested", 0x100000, 1000, 5),
        ev("free_completed", 0x100000, 1000, 5),
        ev("alloc", 0x400000, 512, -1),
        ev("free_completed", 0x400000, 512, -1),
        ev("snapshot", 0, 0),
    ]
    trace1 = [ev("alloc", 0x5000000, 20 * M)]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "release_lock_on_cudamalloc": False,
                "roundup_power2_divisions": {"1": 0, "2": 0}}
    return {"segments": segments, "device_traces": [trace0, trace1],
            "allocator_settings": settings, "external_annotations": []}


def main():
    snap = snapshot()
    for proto in (2, 3, 4, 5):
        with open(f"snapshot_p{proto}.pickle", "wb") as f:
            pickle.dump(snap, f, protocol=proto)
    with open("snapshot_variants.pickle", "wb") as f:
        pickle.dump(variants(), f, protocol=4)  # torch.cuda.memory._dump_snapshot's default
    values = {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31, 2**47 + 5,
                 -2**63, 2**63 - 1],
        "float": 1.5,
        "none": None, "true": True, "false": False,
        "bytes": b"\x00\x01", "bytearray": bytearray(b"ab"),
        "tuple": (1, (2, 3), ()), "set": {7}, "frozenset": frozenset([8]),
        "unicode": "h\u00e9llo",
        "shared": ["x"] * 3,
        "ordered": collections.OrderedDict([("k", 1)]),
        "opaque": Opaque(1, "two"),
    }
    with open("values_p5.pickle", "wb") as f:
        pickle.dump(values, f, protocol=5)
    with open("values_p2.pickle", "wb") as f:
        pickle.dump(values, f, protocol=2)


if __name__ == "__main__":
    main()
