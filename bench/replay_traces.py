#!/usr/bin/env python3
"""Replays every trace under a traces folder with `expanse replay --compare --min-capacity
--repeat 3 --json` and prints a Markdown table: peak live bytes, what PyTorch's caching allocator
reserved for the same workload (recorded, and by expanse's model of it, with how many of the
recorded segment events the model reproduced, and how many empty_cache() calls and
free-and-retries after a failed cudaMalloc were inferred from the recording and replayed), the
model's and the expandable-segments model's
smallest device, expanse's peak mapped memory on the default 80 GiB device (first pass) and the
smallest device on which expanse replays the trace with no OOM, each also as a ratio to peak
live; the first pass's modeled driver time, the least any placement keeping invariant 1 exact
must spend on the blocks live when recording began (replay's preexisting_driver_floor) and on
the blocks live at any one moment (live_set_driver_floor), whether the first pass stays within
max(1.25 x the expandable-segments model, 1.25 x the live-set floor) + 10 ms, and the driver
calls of passes 2 and 3.

A first, short table puts expanse beside PyTorch's expandable segments (the model of
`expandable_segments:True`), per trace: peak memory (expanse's physical, their reserved), whether
expanse is within expandable segments + 64 MiB, within PyTorch's recorded reserved and within
1.03 x peak live + 64 MiB; the first pass's modeled driver time against the bound of the trace's
kind; and the driver calls of passes 2 and 3 (zero once it has settled).

Kinds and bounds (docs/performance.md, "Driver time"): a trace whose block sizes vary from step to
step (`hf_gpt2_*`, GPT-2 recordings with variable lengths; --varying adds names) has
max(1.25 x expandable, the one-page floor) + 10 ms; every other trace repeats its shapes and has
the larger of max(1.25 x expandable, 1.25 x the live-set floor) + 10 ms and 1.1 x what the
baseline allocator spent on it (b12ef1a, the last version before varying workloads were
detected; its figures for the shared traces are built in, --baseline EXPANSE replays others with
that binary).

Builds nothing. Usage (paths relative to the repository root by default):
    bench/replay_traces.py [EXPANSE [TRACES]]      # default build/bin/expanse ../shared/traces
    bench/replay_traces.py --expanse PATH --traces DIR [--varying NAME ...] [--baseline PATH]

Traces are *.pickle / *.pkl (PyTorch memory snapshots) and *.csv (RMM logs), searched
recursively. When the folder holds a README.md with a table of "peak live bytes" and
"PyTorch peak reserved bytes" per trace (as ../shared/traces/README.md does), the figures are
checked against it (column "README"). Exit status: 0, or 1 if a replay failed, a figure
disagrees with the README, or the PyTorch model's peak reserved is more than 2 % off the recording.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gib(b):
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def ratio(v, live):
    return f"{v / live:.4f}" if live else "-"


def readme_figures(folder):
    """{trace name: (peak live, torch reserved)} from the README's table, if any."""
    path = os.path.join(folder, "README.md")
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[2].isdigit() and cells[3].isdigit():
            out[cells[0]] = (int(cells[2]), int(cells[3]))
    return out


# One replay per trace: the first pass on the default 80 GiB device, two more to show steady
# state, and the minimum-capacity search. Further figures add their flags here.
REPLAY_ARGS = ["--compare", "--min-capacity", "--repeat", "3", "--json"]


# What b12ef1a's allocator spent on the first pass of the shared traces that repeat (modeled
# driver seconds, issued as `--host plain` issues them): the baseline of the repeated bound.
BASELINE_SECONDS = {
    "cs336a_medium_128_train": 0.1005,
    "cs336a_medium_512_infer": 0.0211,
    "cs336b_ctx128_fullstep": 0.2797,
    "eor_snapshot": 0.0050,
}
VARYING = [r"^hf_gpt2_"]  # traces whose block sizes vary from step to step


def kind(name, varying):
    return "varying" if any(re.search(v, name) for v in VARYING + varying) else "repeats"


def bound_seconds(j, k, baseline):
    """The first pass's bound for the kind (see the module's docstring) and how it reads."""
    es = j["compare"]["pytorch_expandable"]["modeled_driver_seconds"]
    if k == "varying":
        floor = j.get("one_page_driver_floor", {}).get("modeled_driver_seconds", 0.0)
        return max(1.25 * es, floor) + 0.010, "max(1.25 x expandable, one-page floor) + 10 ms"
    floor = j.get("live_set_driver_floor", {}).get("modeled_driver_seconds", 0.0)
    bound = max(1.25 * es, 1.25 * floor) + 0.010
    text = "max(1.25 x expandable, 1.25 x live-set floor) + 10 ms"
    if baseline is not None and 1.1 * baseline > bound:
        return 1.1 * baseline, "1.1 x b12ef1a"
    return bound, text


def within_bound(j, k, baseline):
    """Whether the first pass's modeled driver time is within its bound, the ratio, the bound."""
    first = j["passes"][0]["modeled_driver_seconds"]
    bound, text = bound_seconds(j, k, baseline)
    return f"{'yes' if first <= bound else 'NO'} ({first / bound:.2f} of {bound:.3f} s: {text})"


def beside_expandable(varying, baselines):
    """The short table: (header, cell(trace name, replay JSON))."""
    def es(j):
        return j["compare"]["pytorch_expandable"]

    def peak(j):
        return j["passes"][0]["peak_physical_bytes"]

    def first(j):
        return j["passes"][0]["modeled_driver_seconds"]

    def yes(ok):
        return "yes" if ok else "NO"

    def torch_ok(j):
        t = j.get("torch_peak_reserved_bytes")
        return "-" if t is None else yes(peak(j) <= t)

    return [
        ("trace", lambda n, j: n),
        ("kind", lambda n, j: kind(n, varying)),
        ("expandable segments peak", lambda n, j: gib(es(j)["peak_reserved_bytes"])),
        ("expanse peak physical", lambda n, j: gib(peak(j))),
        ("expanse - expandable", lambda n, j:
         f"{(peak(j) - es(j)['peak_reserved_bytes']) / 2**20:+.0f} MiB"),
        ("within +64 MiB", lambda n, j:
         yes(peak(j) <= es(j)["peak_reserved_bytes"] + 64 * 2**20)),
        ("within PyTorch's reserved", lambda n, j: torch_ok(j)),
        ("within 1.03 x live + 64 MiB", lambda n, j:
         yes(peak(j) <= 1.03 * j["peak_live_bytes"] + 64 * 2**20)),
        ("expandable driver s", lambda n, j: f"{es(j)['modeled_driver_seconds']:.3f}"),
        ("expanse first pass s", lambda n, j: f"{first(j):.3f}"),
        ("first pass within its kind's bound", lambda n, j:
         within_bound(j, kind(n, varying), baselines.get(n))),
        ("pages created / peak pages", lambda n, j:
         f"{j.get('first_pass_created_pages_per_peak_page', 0):.2f}"),
        ("driver calls passes 2, 3",
         lambda n, j: ", ".join(str(p["driver_calls_total"]) for p in j["passes"][1:])),
    ]


def print_table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def columns(check):
    """The table's columns: (header, cell(trace name, replay JSON)); add new ones here."""
    def live(j):
        return j["peak_live_bytes"]

    def torch(j):
        t = j.get("torch_peak_reserved_bytes")
        return f"{t} ({ratio(t, live(j))})" if t is not None else "-"

    def first(j):
        return j["passes"][0]

    def agree(j):
        return j["compare"]["pytorch_model_agreement"]

    def model_min(j, row):
        b = j["compare"][row]["min_capacity_bytes"]
        return f"{gib(b)} ({ratio(b, live(j))})"

    return [
        ("trace", lambda n, j: n),
        ("allocs", lambda n, j: str(j["allocs"])),
        ("peak live bytes", lambda n, j: f"{live(j)} ({gib(live(j))})"),
        ("PyTorch peak reserved (x live)", lambda n, j: torch(j)),
        ("PyTorch model peak reserved (error)",
         lambda n, j: f"{agree(j)['model_peak_reserved_bytes']} "
                      f"({100 * agree(j)['peak_reserved_error']:.2f} %)"),
        ("recorded segment events reproduced",
         lambda n, j: f"{agree(j)['reproduced_segment_events']} of "
                      f"{agree(j)['recorded_segment_events']}"),
        ("inferred empty_cache() / free-and-retry",
         lambda n, j: f"{agree(j)['inferred_empty_cache_calls']} / "
                      f"{agree(j)['inferred_free_and_retries']}"),
        ("PyTorch model min capacity (x live)", lambda n, j: model_min(j, "pytorch")),
        ("expandable segments model min capacity (x live)",
         lambda n, j: model_min(j, "pytorch_expandable")),
        ("expanse peak mapped @80GiB (x live)",
         lambda n, j: f"{first(j)['peak_mapped_bytes']} "
                      f"({ratio(first(j)['peak_mapped_bytes'], live(j))})"),
        ("expanse min capacity (x live)",
         lambda n, j: f"{j['min_capacity_bytes']} ({ratio(j['min_capacity_bytes'], live(j))})"),
        ("min <= 1.01 live + 64 MiB",
         lambda n, j: "yes" if j["min_capacity_bytes"] <= live(j) * 1.01 + 64 * 2**20 else "NO"),
        ("OOMs @80GiB", lambda n, j: str(j["ooms"])),
        ("modeled driver s (PyTorch model / expandable / expanse)",
         lambda n, j: f"{j['compare']['pytorch']['modeled_driver_seconds']:.3f} / "
                      f"{j['compare']['pytorch_expandable']['modeled_driver_seconds']:.3f} / "
                      f"{first(j)['modeled_driver_seconds']:.3f}"),
        ("floor under expanse's first pass s (invariant 1, blocks live at the start)",
         lambda n, j: f"{j['preexisting_driver_floor']['modeled_driver_seconds']:.3f}"
                      if "preexisting_driver_floor" in j else "-"),
        ("floor under it s (invariant 1, blocks live at once)",
         lambda n, j: f"{j['live_set_driver_floor']['modeled_driver_seconds']:.3f}"
                      if "live_set_driver_floor" in j else "-"),
        ("one-page floor s (pages of peak live, one handle each)",
         lambda n, j: f"{j['one_page_driver_floor']['modeled_driver_seconds']:.3f}"
                      if "one_page_driver_floor" in j else "-"),
        ("driver calls passes 2, 3",
         lambda n, j: ", ".join(str(p["driver_calls_total"]) for p in j["passes"][1:])),
        ("wall s", lambda n, j: f"{j['wall_seconds']:.2f}"),
        ("README", lambda n, j: check),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("expanse_pos", nargs="?", metavar="EXPANSE", help="the expanse binary")
    p.add_argument("traces_pos", nargs="?", metavar="TRACES", help="the traces folder")
    p.add_argument("--expanse", default=os.path.join(ROOT, "build", "bin", "expanse"))
    p.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces"))
    p.add_argument("--varying", action="append", default=[], metavar="NAME",
                   help="a trace (regular expression on its name) whose block sizes vary")
    p.add_argument("--baseline", metavar="EXPANSE",
                   help="the baseline allocator's expanse binary (b12ef1a): its first pass on "
                        "each repeating trace not built in, issued plainly")
    a = p.parse_args()
    a.expanse = a.expanse_pos or a.expanse
    a.traces = a.traces_pos or a.traces
    if not os.path.isdir(a.traces):
        print(f"no traces folder at {a.traces}: nothing to replay")
        return 0
    if not os.access(a.expanse, os.X_OK):
        print(f"{a.expanse} is not an executable (build it first, or pass --expanse)",
              file=sys.stderr)
        return 1
    traces = []
    for d, _, files in os.walk(a.traces):
        for f in files:
            if re.search(r"\.(pickle|pkl|csv)$", f):
                traces.append(os.path.join(d, f))
    traces.sort()
    if not traces:
        print(f"no traces under {a.traces}")
        return 0
    expected = readme_figures(a.traces)

    env = dict(os.environ)
    env.pop("EXPANSE_CONF", None)  # the default device: 80 GiB sim, default allocator options
    baselines = dict(BASELINE_SECONDS)
    if a.baseline:
        for t in traces:
            name = re.sub(r"\.(pickle|pkl|csv)$", "", os.path.basename(t))
            if name in baselines or kind(name, a.varying) == "varying":
                continue
            r = subprocess.run([a.baseline, "replay", t, "--json"], capture_output=True,
                               text=True, env=env)
            if r.returncode == 0:
                baselines[name] = json.loads(r.stdout)["passes"][0]["modeled_driver_seconds"]
            else:
                print(f"{name}: the baseline's replay failed: {r.stderr.strip()}", file=sys.stderr)
    rows, short, bad = [], [], 0
    for t in traces:
        name = re.sub(r"\.(pickle|pkl|csv)$", "", os.path.basename(t))
        r = subprocess.run([a.expanse, "replay", t] + REPLAY_ARGS, capture_output=True,
                           text=True, env=env)
        if r.returncode != 0:
            bad += 1
            print(f"{name}: expanse replay failed ({r.returncode}): {r.stderr.strip()}",
                  file=sys.stderr)
            continue
        j = json.loads(r.stdout)
        live = j["peak_live_bytes"]
        torch = j.get("torch_peak_reserved_bytes")
        check = ""
        if name in expected:
            ok = (live, torch) == expected[name]
            check = "ok" if ok else f"DIFFERS {expected[name]}"
            bad += 0 if ok else 1
        bad += 0 if j["compare"]["pytorch_model_agreement"]["peak_reserved_error"] <= 0.02 else 1
        rows.append([cell(name, j) for _, cell in columns(check)])
        short.append([cell(name, j) for _, cell in beside_expandable(a.varying, baselines)])
    print_table([h for h, _ in beside_expandable(a.varying, baselines)], short)
    print()
    print_table([h for h, _ in columns("")], rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
