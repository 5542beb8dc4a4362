#!/usr/bin/env python3
"""Checks that every #include between the folders of src/ (and from tools/ and bench/) points
down the layers written in src/layers.txt.

Usage: check_layers.py REPO_ROOT
Exit status 0 when every include is allowed; 1 with one line per offending include (file, line,
what it includes, and what its folder may include); 2 when layers.txt itself is wrong.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".inc")


def read_layers(path):
    """Returns (rank by src folder, allowed include prefixes by outside folder)."""
    ranks, outside = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if words[0].endswith(":"):  # "tools: conf replay driver/driver.hpp"
                outside[words[0][:-1]] = words[1:]
            elif len(words) >= 2 and words[0].isdigit():
                if words[1] in ranks:
                    raise ValueError(f"{path}:{n}: folder '{words[1]}' is ranked twice")
                ranks[words[1]] = int(words[0])
            else:
                raise ValueError(f"{path}:{n}: expected 'RANK FOLDER' or 'FOLDER: ALLOWED...', "
                                 f"got '{raw.strip()}'")
    return ranks, outside


def sources(top):
    for dirpath, _, files in os.walk(top):
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, name)


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1)


def check(root):
    src = os.path.join(root, "src")
    ranks, outside = read_layers(os.path.join(src, "layers.txt"))
    problems = []
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for d in folders:
        if d not in ranks:
            problems.append(f"src/{d}/: a folder src/layers.txt does not rank (give it a rank)")
    for d in ranks:
        if d not in folders:
            problems.append(f"src/layers.txt ranks '{d}', which is not a folder of src/")

    def below(d):
        return sorted(x for x in ranks if ranks[x] < ranks[d])

    for d in folders:
        if d not in ranks:
            continue
        for path in sources(os.path.join(src, d)):
            rel = os.path.relpath(path, root)
            for n, inc in includes(path):
                top = inc.split("/", 1)[0]
                if "/" not in inc or top == d or top == "expanse" or top not in ranks:
                    continue  # own folder, public header, or a file beside it
                if ranks[top] >= ranks[d]:
                    problems.append(
                        f"{rel}:{n}: includes \"{inc}\": {d}/ (rank {ranks[d]}) may include only "
                        f"folders of a lower rank ({', '.join(below(d)) or 'none'}), and "
                        f"{top}/ has rank {ranks[top]}")
    for d, allowed in sorted(outside.items()):
        top_dir = os.path.join(root, d)
        if not os.path.isdir(top_dir):
            problems.append(f"src/layers.txt names '{d}:', which is not a folder of the repository")
            continue
        for path in sources(top_dir):
            rel = os.path.relpath(path, root)
            for n, inc in includes(path):
                top = inc.split("/", 1)[0]
                if "/" not in inc or top == "expanse" or top not in ranks:
                    continue
                if top in allowed or inc in allowed:
                    continue
                problems.append(f"{rel}:{n}: includes \"{inc}\": {d}/ may include only "
                                f"{', '.join(allowed)} (and the public headers)")
    return problems


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        problems = check(argv[1])
    except (OSError, ValueError) as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layers in src/layers.txt "
              f"(docs/design.md, Layers)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
