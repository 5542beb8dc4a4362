#!/usr/bin/env python3
"""The layer checker refuses what the rule forbids: on a copy of the repository's src/, tools/
and bench/, it passes as the tree is, then fails, naming the file, line and include, once an
include points up, sideways, or into a folder with no rank; and inside core/, once an include
between two rooms points up or sideways, a room includes core/'s root, or a room has no rank.

Usage: check_layers_test.py REPO_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_layers.py")


def run(root):
    p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def ranks(root):
    out = {}
    with open(os.path.join(root, "src", "layers.txt"), encoding="utf-8") as f:
        for raw in f:
            words = raw.split("#", 1)[0].split()
            if len(words) >= 2 and words[0].isdigit():
                out[words[1]] = int(words[0])
    return out


def room_ranks(root, folder):
    out = {}
    with open(os.path.join(root, "src", "layers.txt"), encoding="utf-8") as f:
        for raw in f:
            words = raw.split("#", 1)[0].split()
            if len(words) >= 2 and words[0].startswith(folder + "/"):
                out[words[1]] = int(words[0].split("/", 1)[1])
    return out


def first_source(folder):
    for dirpath, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if name.endswith((".cpp", ".hpp")):
                return os.path.join(dirpath, name)
    raise AssertionError(f"no source file under {folder}")


def add_include(path, inc):
    with open(path, "a", encoding="utf-8") as f:
        f.write(f'\n#include "{inc}"\n')
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def expect_refused(root, path, line, inc, what):
    rc, out = run(root)
    rel = os.path.relpath(path, root)
    want = f'{rel}:{line}: includes "{inc}"'
    if rc != 1 or want not in out:
        raise AssertionError(f"{what}: expected exit 1 naming '{want}', got {rc}:\n{out}")


def main(argv):
    repo = argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("src", "tools", "bench"):
            if os.path.isdir(os.path.join(repo, d)):
                shutil.copytree(os.path.join(repo, d), os.path.join(tmp, d))
        rc, out = run(tmp)
        if rc != 0:
            print(f"the copy of the tree should pass as it is, got {rc}:\n{out}")
            return 1
        r = ranks(tmp)
        order = sorted(r, key=lambda d: r[d])
        lowest, highest = order[0], order[-1]
        cases = [(lowest, highest, "an include of the top layer from the bottom one")]
        for lo, hi in zip(order, order[1:]):
            if r[lo] < r[hi]:
                cases.append((lo, hi, f"an include one layer up ({lo} -> {hi})"))
        same = [(a, b) for a in order for b in order if a != b and r[a] == r[b]]
        if same:
            cases.append((same[0][0], same[0][1], "a sideways include (same rank)"))
        for frm, to, what in cases:
            case = os.path.join(tmp, "case")
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(tmp, case, ignore=shutil.ignore_patterns("case"))
            path = first_source(os.path.join(case, "src", frm))
            inc = f"{to}/{os.path.basename(first_source(os.path.join(case, 'src', to)))}"
            line = add_include(path, inc)
            try:
                expect_refused(case, path, line, inc, what)
                print(f"refused as it should be: {what}")
            except AssertionError as e:
                print(e)
                failures += 1
        # core/'s rooms: the lowest including the highest, one rank up, sideways, the root.
        rr = room_ranks(tmp, "core")
        rooms = sorted(rr, key=lambda x: rr[x])
        room_cases = [(rooms[0], rooms[-1], "core/: the lowest room including the highest")]
        for lo, hi in zip(rooms, rooms[1:]):
            if rr[lo] < rr[hi]:
                room_cases.append((lo, hi, f"core/: an include one room up ({lo} -> {hi})"))
        twins = [(a, b) for a in rooms for b in rooms if a != b and rr[a] == rr[b]]
        if twins:
            room_cases.append((twins[0][0], twins[0][1], "core/: a sideways include between rooms"))
        room_cases.append((rooms[-1], None, "core/: a room including core/'s root"))
        for frm, to, what in room_cases:
            case = os.path.join(tmp, "case")
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(tmp, case, ignore=shutil.ignore_patterns("case"))
            path = first_source(os.path.join(case, "src", "core", frm))
            if to is None:
                inc = "core/device_allocator.hpp"
            else:
                target = first_source(os.path.join(case, "src", "core", to))
                inc = f"core/{to}/{os.path.basename(target)}"
            line = add_include(path, inc)
            try:
                expect_refused(case, path, line, inc, what)
                print(f"refused as it should be: {what}")
            except AssertionError as e:
                print(e)
                failures += 1
        case = os.path.join(tmp, "case")
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(tmp, case, ignore=shutil.ignore_patterns("case"))
        os.makedirs(os.path.join(case, "src", "core", "unranked"))
        rc, out = run(case)
        if rc != 1 or "src/core/unranked/" not in out:
            print(f"a room with no rank should be refused, got {rc}:\n{out}")
            failures += 1
        else:
            print("refused as it should be: a room with no rank")
        case = os.path.join(tmp, "case")
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(tmp, case, ignore=shutil.ignore_patterns("case"))
        os.makedirs(os.path.join(case, "src", "unranked"))
        rc, out = run(case)
        if rc != 1 or "src/unranked/" not in out:
            print(f"a folder with no rank should be refused, got {rc}:\n{out}")
            failures += 1
        else:
            print("refused as it should be: a folder with no rank")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
