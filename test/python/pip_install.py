"""pip-installs the expanse package with no package index, then imports it with no
EXPANSE_LIBRARY and EXPANSE_CONF=driver:sim: the installed package must load the libexpanse.so it
carries and answer memory_stats().

  pip_install.py target WORK SRC...  each SRC (./python, the repository root) into a fresh
                                     --target folder; the library comes from EXPANSE_BUILD_DIR
                                     (the test suite's build), so nothing is compiled
  pip_install.py sdist WORK REPO     the backend's sdist, unpacked: it must configure with CMake
                                     on its own and pip-install (library from EXPANSE_BUILD_DIR)
  pip_install.py venv WORK SRC       a fresh `python -m venv`, then `pip install SRC` compiling
                                     libexpanse.so from scratch; prints how long each step took
"""
import os
import shutil
import subprocess
import sys
import tarfile
import time

CHECK = ("import expanse, expanse.torch\n"
         "s = expanse.memory_stats()\n"
         "assert s['allocated_bytes.all.current'] == 0, s\n"
         "import os\n"
         "for f in expanse.torch._NATIVE_SOURCES:\n"
         "    assert os.path.isfile(os.path.join(expanse.torch._NATIVE_DIR, f)), f\n"
         "print(expanse.torch._include_dir())\n"
         "print(expanse.library_path())\n"
         "print(expanse.driver_description())\n")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, env=None, cwd=None, what=None):
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        fail(f"{what or ' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}")
    return r.stdout, time.monotonic() - t0


def pip_env(reuse_build):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("EXPANSE_LIBRARY", None)
    if not reuse_build:
        env.pop("EXPANSE_BUILD_DIR", None)
    elif not env.get("EXPANSE_BUILD_DIR"):
        fail("EXPANSE_BUILD_DIR is not set (the build folder whose libexpanse.so to reuse)")
    return env


def check_import(python, site, work, under):
    """Imports the installed package from a folder outside the repository, with no
    EXPANSE_LIBRARY; it must load the copy of the library inside the installed package (in
    `under`)."""
    env = dict(os.environ, EXPANSE_CONF="driver:sim", PYTHONDONTWRITEBYTECODE="1")
    env.pop("EXPANSE_LIBRARY", None)
    env.pop("PYTHONPATH", None)
    if site:
        env["PYTHONPATH"] = site
    out, _ = run([python, "-c", CHECK], env=env, cwd=work, what="import expanse")
    lines = out.strip().splitlines()
    if len(lines) < 3 or not lines[-1].startswith("sim"):
        fail(f"unexpected output of the import check:\n{out}")
    lib, inc = lines[-2], lines[-3]
    under = os.path.realpath(under) + os.sep
    # The native PyTorch allocator compiles against the headers the package carries.
    if not os.path.realpath(inc).startswith(under):
        fail(f"the installed package found expanse.h in {inc}, not in the package")
    if os.path.basename(os.path.dirname(lib)) != "expanse" or not os.path.realpath(lib).startswith(under):
        fail(f"the installed package loaded {lib}, not the library it carries")
    print(f"ok: {lib}, {lines[-1]}")


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def cmd_target(work, sources):
    fresh(work)
    for i, src in enumerate(sources):
        site = os.path.join(work, f"site{i}")
        run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", site, src],
            env=pip_env(reuse_build=True), what=f"pip install {src}")
        check_import(sys.executable, site, work, site)


def cmd_sdist(work, repo):
    fresh(work)
    sys.path.insert(0, os.path.join(repo, "python", "_build"))
    import expanse_build
    name = expanse_build.build_sdist(work)
    with tarfile.open(os.path.join(work, name)) as t:
        # The "data" filter where this Python has it (newer ones warn without a filter).
        t.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tree = os.path.join(work, name[:-len(".tar.gz")])
    # The sdist alone must configure the library-only build (no file it needs left out).
    run(["cmake", "-S", tree, "-B", os.path.join(work, "build"), *expanse_build.CMAKE_OPTIONS],
        what="cmake configure of the unpacked sdist")
    site = os.path.join(work, "site")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", site, tree],
        env=pip_env(reuse_build=True), what="pip install of the unpacked sdist")
    check_import(sys.executable, site, work, site)


def cmd_venv(work, src):
    fresh(work)
    venv = os.path.join(work, "venv")
    _, t_venv = run([sys.executable, "-m", "venv", venv],
                    what="python -m venv (Debian: apt-get install python3-venv)")
    python = os.path.join(venv, "bin", "python")
    out, t_pip = run([python, "-m", "pip", "install", "-v", src], env=pip_env(reuse_build=False),
                     what=f"pip install {src} (compiling libexpanse.so)")
    if "building libexpanse.so with CMake" not in out:
        fail(f"pip install did not compile libexpanse.so:\n{out}")
    check_import(python, None, work, venv)
    print(f"timing: venv {t_venv:.1f} s, pip install (compiling libexpanse.so, "
          f"{os.cpu_count()} cores) {t_pip:.1f} s")


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("target", "sdist", "venv"):
        fail(__doc__)
    mode, work, rest = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    {"target": lambda: cmd_target(work, rest), "sdist": lambda: cmd_sdist(work, rest[0]),
     "venv": lambda: cmd_venv(work, rest[0])}[mode]()


if __name__ == "__main__":
    main()
