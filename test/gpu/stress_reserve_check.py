#!/usr/bin/env python3
"""Judges `expanse stress --reserve free --json` (run_on_gpu.sh: stress-reserve): memory held up
front must not make the large request slower than without it. The command runs the stress twice,
with the reservation and without it (its `unreserved` object); this script prints the request's
wall time in both and exits 1 when the reserved one exceeds 1.1 x the unreserved one, or when
either run failed.

    python3 test/gpu/stress_reserve_check.py stress_reserve.json
"""
import json
import sys

BOUND = 1.1


def main(path):
    with open(path) as f:
        r = json.load(f)
    u = r.get("unreserved")
    if not r.get("ok") or not r.get("allocated"):
        print(f"FAIL: the run with the reservation did not allocate and verify: "
              f"{r.get('error', 'no error given')}")
        return 1
    if not u or not u.get("allocated"):
        print("FAIL: no run without the reservation to compare with (was a reservation held? "
              f"reserved_bytes={r.get('reserved_bytes')})")
        return 1
    held, asked = r.get("reserved_bytes", 0), r.get("reserve_asked_bytes", 0)
    with_s, without_s = r["alloc_seconds"], u["alloc_seconds"]
    ratio = with_s / without_s if without_s > 0 else float("inf")
    modeled = r.get("modeled_vs_unreserved")
    print(f"reservation held {held / 2**30:.2f} GiB (asked {asked / 2**30:.2f} GiB); the "
          f"{r['size_bytes'] / 2**30:.2f} GiB request: {with_s * 1e3:.1f} ms with it "
          f"({r.get('driver_calls_total')} driver calls, {r.get('request_mem_creates')} "
          f"cuMemCreate), {without_s * 1e3:.1f} ms without ({u.get('driver_calls_total')} calls, "
          f"{u.get('request_mem_creates')} cuMemCreate): {ratio:.2f} x timed"
          + (f", {modeled:.2f} x modeled" if modeled is not None else ""))
    if ratio > BOUND:
        print(f"FAIL: the reserved request took {ratio:.2f} x the unreserved one (at most {BOUND})")
        return 1
    print(f"ok: at most {BOUND} x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
