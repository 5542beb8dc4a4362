#!/usr/bin/env python3
"""Checks the house beyond its layers: no two source files of src/ share a name (one name, one
idea: a newcomer finds the one file an idea lives in), and README.md is a product page (at most
12,000 characters; its Quick start has exactly the two command blocks).

Usage: check_house.py REPO_ROOT            # the checks on the tree
       check_house.py --self-test REPO_ROOT  # on copies of it, each rule broken once is refused
Exit status 0, or 1 with one line per problem.
"""
import os
import re
import shutil
import sys
import tempfile

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".inc")
README_LIMIT = 12000


def same_names(root):
    seen, problems = {}, []
    src = os.path.join(root, "src")
    for dirpath, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if name in seen:
                problems.append(f"{rel}: the same name as {seen[name]} (one name, one idea: "
                                f"name each for what it does where it is)")
            else:
                seen[name] = rel
    return problems


def readme(root):
    path = os.path.join(root, "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []
    if len(text) > README_LIMIT:
        problems.append(f"README.md: {len(text)} characters, more than {README_LIMIT} (a product "
                        f"page: move measurements and caveats to docs/)")
    m = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        problems.append("README.md: no '## Quick start' section")
    else:
        blocks = re.findall(r"^```sh\n", m.group(1), re.M)
        if len(blocks) != 2:
            problems.append(f"README.md: Quick start has {len(blocks)} ```sh blocks, not the two")
    return problems


def check(root):
    return same_names(root) + readme(root)


def self_test(repo):
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        def fresh():
            case = os.path.join(tmp, "case")
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(os.path.join(repo, "src"), os.path.join(case, "src"))
            shutil.copy(os.path.join(repo, "README.md"), os.path.join(case, "README.md"))
            return case

        case = fresh()
        if check(case):
            print("the copy should pass as it is:\n" + "\n".join(check(case)))
            return 1
        # A second file of one name, in another folder.
        case = fresh()
        open(os.path.join(case, "src", "api", "device_allocator.hpp"), "w").close()
        out = check(case)
        if not any("src/api/device_allocator.hpp" in p or "src/core/device_allocator.hpp" in p
                   for p in out):
            print("a second device_allocator.hpp should be refused, got:", out)
            failures += 1
        else:
            print("refused as it should be: two source files of one name")
        # A README grown past the limit.
        case = fresh()
        with open(os.path.join(case, "README.md"), "a", encoding="utf-8") as f:
            f.write("x" * (README_LIMIT + 1) + "\n")
        if not any("characters" in p for p in check(case)):
            print("a README over the limit should be refused")
            failures += 1
        else:
            print("refused as it should be: a README over the limit")
        # A third command block in Quick start.
        case = fresh()
        path = os.path.join(case, "README.md")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = text.replace("## Quick start\n", "## Quick start\n\n```sh\ntrue\n```\n", 1)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if not any("Quick start has 3" in p for p in check(case)):
            print("a third Quick start block should be refused")
            failures += 1
        else:
            print("refused as it should be: a third Quick start block")
    return 1 if failures else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(argv[1])
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
