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


def main():
    snap = snapshot()
    for proto in (2, 3, 4, 5):
        with open(f"snapshot_p{proto}.pickle", "wb") as f:
            pickle.dump(snap, f, protocol=proto)
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
