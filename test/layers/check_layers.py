#!/usr/bin/env python3
"""Checks that every #include between the folders of src/ (and from tools/ and bench/) points
down the layers written in src/layers.txt, and, inside a layer whose folder has rooms (core/),
every include between its rooms points down their order too.

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
    """Returns (rank by src folder, allowed include prefixes by outside folder, rank of each room
    by folder: {folder: {room: rank}})."""
    ranks, outside, rooms = {}, {}, {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            room = re.fullmatch(r"(\w+)/(\d+)", words[0])
            if words[0].endswith(":"):  # "tools: conf replay driver/driver.hpp"
                outside[words[0][:-1]] = words[1:]
            elif room and len(words) >= 2:  # "core/2 placement"
                of = rooms.setdefault(room.group(1), {})
                if words[1] in of:
                    raise ValueError(f"{path}:{n}: room '{room.group(1)}/{words[1]}' is ranked "
                                     f"twice")
                of[words[1]] = int(room.group(2))
            elif len(words) >= 2 and words[0].isdigit():
                if words[1] in ranks:
                    raise ValueError(f"{path}:{n}: folder '{words[1]}' is ranked twice")
                ranks[words[1]] = int(words[0])
            else:
                raise ValueError(f"{path}:{n}: expected 'RANK FOLDER', 'FOLDER/RANK ROOM' or "
                                 f"'FOLDER: ALLOWED...', got '{raw.strip()}'")
    for folder in rooms:
        if folder not in ranks:
            raise ValueError(f"{path}: rooms of '{folder}', which has no rank")
    return ranks, outside, rooms


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
    ranks, outside, rooms = read_layers(os.path.join(src, "layers.txt"))
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

    problems += check_rooms(src, root, rooms)
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


def check_rooms(src, root, rooms):
    """Inside each folder with rooms: every subfolder is a ranked room; a room includes only its
    own files and rooms of a lower rank; the folder's own files (its root) include any room, and
    no room includes them."""
    problems = []
    for folder, rank in sorted(rooms.items()):
        base = os.path.join(src, folder)
        subdirs = sorted(x for x in os.listdir(base) if os.path.isdir(os.path.join(base, x)))
        for x in subdirs:
            if x not in rank:
                problems.append(f"src/{folder}/{x}/: a room src/layers.txt does not rank "
                                f"(give it a line '{folder}/RANK {x}')")
        for x in rank:
            if x not in subdirs:
                problems.append(f"src/layers.txt ranks the room '{folder}/{x}', which is not a "
                                f"folder of src/{folder}/")
        for x in subdirs:
            if x not in rank:
                continue
            lower = sorted(r for r in rank if rank[r] < rank[x])
            for path in sources(os.path.join(base, x)):
                rel = os.path.relpath(path, root)
                for n, inc in includes(path):
                    parts = inc.split("/")
                    if parts[0] != folder or len(parts) < 2:
                        continue  # another layer's (checked above) or a file beside it
                    if len(parts) == 2:
                        problems.append(
                            f"{rel}:{n}: includes \"{inc}\": a room of {folder}/ never includes "
                            f"the files at {folder}/'s root (they include the rooms)")
                        continue
                    to = parts[1]
                    if to == x:
                        continue
                    if to not in rank or rank[to] >= rank[x]:
                        problems.append(
                            f"{rel}:{n}: includes \"{inc}\": {folder}/{x}/ (rank {rank[x]}) may "
                            f"include only rooms of a lower rank ({', '.join(lower) or 'none'}), "
                            f"and {folder}/{to}/ has rank "
                            f"{rank[to] if to in rank else 'none'}")
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
