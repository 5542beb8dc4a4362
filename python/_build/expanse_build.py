"""A PEP 517 build backend for the expanse package, standard library only.

A wheel holds the package's .py files and libexpanse.so, built by CMake from the repository this
file lies in (python/_build/ of a clone, or of the sdist, which has the same layout). Writing the
backend here rather than using scikit-build-core keeps `pip install ./python` and `pip install .`
free of downloads: pip's build isolation would otherwise fetch the backend from PyPI, and a wheel
must build offline from a clone.

Environment:
  EXPANSE_BUILD_DIR=DIR  take DIR/lib/libexpanse.so from an expanse build folder as it is,
                         compiling nothing (the test suite passes its own build folder)
  CMAKE_ARGS="..."       extra arguments for the CMake configure (e.g. a compiler launcher,
                         -DCUDAToolkit_ROOT=...)
  CMAKE_BUILD_PARALLEL_LEVEL=N  compile jobs (default: every core)
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

NAME = "expanse"
VERSION = "0.1.0"
PY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(PY_DIR)  # the repository (or the unpacked sdist)
CMAKE_MIN = (3, 25)
# The library's file name inside the package; _lib.py looks for it next to itself first.
LIB_NAME = "libexpanse.so"
# What the library-only build needs of the repository (the sdist carries these).
SDIST_DIRS = ("cmake", "include", "src")
SDIST_FILES = ("CMakeLists.txt", "pyproject.toml", "README.md")
# A library-only build: no tests, benchmarks, examples or CLI, so nothing beyond CMake, a C++17
# compiler and the CUDA headers is needed.
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DEXPANSE_BUILD_TESTS=OFF",
                 "-DEXPANSE_BUILD_BENCH=OFF", "-DEXPANSE_BUILD_EXAMPLES=OFF",
                 "-DEXPANSE_BUILD_CLI=OFF")


class BuildError(RuntimeError):
    pass


def _tag():
    # The library is native code but calls no Python C API (ctypes loads it), so any Python 3
    # on this platform can use it: py3-none-<platform>, e.g. py3-none-linux_x86_64.
    plat = re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())
    return f"py3-none-{plat}"


def _package_files():
    root = os.path.join(PY_DIR, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            # _installed.py is cmake --install's; a wheel's library lies in the package instead.
            # native/: the PyTorch allocator's C++ sources, compiled against the user's torch.
            native = os.path.basename(dirpath) == "native" and f.endswith((".cpp", ".hpp"))
            if (f.endswith(".py") and f != "_installed.py") or f == "py.typed" or native:
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, PY_DIR).replace(os.sep, "/")


def _header_files():
    # The C headers the native PyTorch allocator compiles against (expanse.h and what it
    # includes), where expanse.torch looks for them: the package's include/ folder.
    inc = os.path.join(ROOT, "include", NAME)
    for f in sorted(os.listdir(inc)):
        if f.endswith(".h"):
            yield os.path.join(inc, f), f"{NAME}/include/{NAME}/{f}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Python bindings of expanse, a virtual-memory GPU allocator\n"
            "Requires-Python: >=3.8\n").encode()


def _wheel_file(pure=False):
    tag = "py3-none-any" if pure else _tag()
    purelib = "true" if pure else "false"
    return (f"Wheel-Version: 1.0\nGenerator: expanse_build\nRoot-Is-Purelib: {purelib}\n"
            f"Tag: {tag}\n").encode()


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _dist_info():
    return f"{NAME}-{VERSION}.dist-info"


# ---- building libexpanse.so ---------------------------------------------------------------------

def _say(msg):
    print(f"expanse_build: {msg}", file=sys.stderr, flush=True)


def _run(cmd):
    """Runs cmd, echoing its output to stderr (pip shows it with -v or on failure); returns
    (exit status, output)."""
    _say("$ " + " ".join(shlex.quote(c) for c in cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    lines = []
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line)
    return proc.wait(), "".join(lines)


def _cmake():
    cmake = shutil.which("cmake")
    how = ("Debian/Ubuntu: apt-get install cmake; or pip install cmake into the environment "
           "pip runs in; or set EXPANSE_BUILD_DIR to an expanse build folder that holds a "
           "built lib/libexpanse.so")
    if not cmake:
        raise BuildError(f"expanse: building libexpanse.so needs CMake {CMAKE_MIN[0]}.{CMAKE_MIN[1]}"
                         f" or newer, and no cmake is on PATH ({how})")
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < CMAKE_MIN:
        raise BuildError(f"expanse: building libexpanse.so needs CMake {CMAKE_MIN[0]}."
                         f"{CMAKE_MIN[1]} or newer; {cmake} is {out.strip() or 'unknown'} ({how})")
    return cmake


def _explain_configure_failure(output):
    """A sentence naming what the failed configure lacked, for the causes a user can fix."""
    if "CUDAToolkit" in output and re.search(r"Could NOT find CUDAToolkit|CUDAToolkit.*not found",
                                             output):
        return ("CMake found no CUDA toolkit: libexpanse.so is compiled against its headers "
                "(cuda.h) and links no CUDA library. Install the CUDA 13 toolkit "
                "(https://developer.nvidia.com/cuda-downloads; it goes to /usr/local/cuda, where "
                "CMake looks), or pass CMAKE_ARGS=-DCUDAToolkit_ROOT=/path/to/cuda")
    if re.search(r"No CMAKE_CXX_COMPILER could be found|CMAKE_CXX_COMPILER.*not", output):
        return ("CMake found no C++ compiler: install one with C++17 (Debian/Ubuntu: apt-get "
                "install g++) or name it in CXX")
    if re.search(r"No CMAKE_C_COMPILER could be found|CMAKE_C_COMPILER.*not", output):
        return ("CMake found no C compiler: install one (Debian/Ubuntu: apt-get install gcc) or "
                "name it in CC")
    if "Threads" in output and "Could NOT find Threads" in output:
        return "CMake found no threads library (pthreads): install the C library's headers"
    return "see CMake's output above"


def _check_repository():
    if not (os.path.isfile(os.path.join(ROOT, "CMakeLists.txt"))
            and os.path.isdir(os.path.join(ROOT, "src"))):
        raise BuildError(
            f"expanse: the CMake project is not at {ROOT}: python/ builds libexpanse.so from the "
            "repository around it, so install from a clone or the sdist (pip older than 21.3 "
            "copies ./python alone to a temporary folder: upgrade pip, or pip install the "
            "repository root)")


def _built_library(build_dir):
    lib = os.path.join(build_dir, "lib", LIB_NAME)
    if not os.path.isfile(lib):
        raise BuildError(f"expanse: {lib} does not exist; EXPANSE_BUILD_DIR must be an expanse "
                         "build folder in which libexpanse.so is built (cmake --build DIR "
                         "--target expanse)")
    return lib


def _build_library(work):
    """Returns the path of a libexpanse.so to ship: EXPANSE_BUILD_DIR's, or one CMake builds in
    `work` from the repository."""
    given = os.environ.get("EXPANSE_BUILD_DIR")
    if given:
        lib = _built_library(os.path.abspath(given))
        _say(f"using {lib} (EXPANSE_BUILD_DIR; nothing compiled)")
        return lib
    _check_repository()
    cmake = _cmake()
    build = os.path.join(work, "build")
    _say(f"building libexpanse.so with CMake in {build} (a few minutes; EXPANSE_BUILD_DIR=<a "
         "built expanse build folder> reuses its library instead)")
    cmd = [cmake, "-S", ROOT, "-B", build, *CMAKE_OPTIONS,
           *shlex.split(os.environ.get("CMAKE_ARGS", ""))]
    rc, out = _run(cmd)
    if rc != 0:
        raise BuildError("expanse: configuring libexpanse.so's build failed: "
                         + _explain_configure_failure(out))
    cmd = [cmake, "--build", build, "--target", "expanse"]
    if not os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL"):
        cmd += ["--parallel", str(os.cpu_count() or 1)]
    rc, out = _run(cmd)
    if rc != 0:
        raise BuildError("expanse: compiling libexpanse.so failed; see the compiler's output above")
    return _built_library(build)


# ---- PEP 517 hooks ------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _write_metadata(metadata_directory, pure):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "wb") as f:
        f.write(_wheel_file(pure))
    return _dist_info()


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory, pure=False)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory, pure=True)


def _write_wheel(wheel_directory, entries, pure):
    """entries: (name in the wheel, bytes, unix mode)."""
    tag = "py3-none-any" if pure else _tag()
    name = f"{NAME}-{VERSION}-{tag}.whl"
    records = []
    dist = _dist_info()
    entries = list(entries) + [(f"{dist}/METADATA", _metadata(), 0o644),
                               (f"{dist}/WHEEL", _wheel_file(pure), 0o644)]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data, mode in entries:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(_record_line(arcname, data))
        record = f"{dist}/RECORD"
        z.writestr(record, "\n".join(records + [f"{record},,"]) + "\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for full, arcname in list(_package_files()) + list(_header_files()):
        with open(full, "rb") as f:
            entries.append((arcname, f.read(), 0o644))
    with tempfile.TemporaryDirectory(prefix="expanse-build-") as work:
        with open(_build_library(work), "rb") as f:  # follows the .so -> .so.0 links
            entries.append((f"{NAME}/{LIB_NAME}", f.read(), 0o755))
    return _write_wheel(wheel_directory, entries, pure=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts python/ on sys.path; the library goes next to the package's sources
    # (git ignores it), where _lib.py looks first, as an in-place build puts extension modules.
    with tempfile.TemporaryDirectory(prefix="expanse-build-") as work:
        shutil.copyfile(_build_library(work), os.path.join(PY_DIR, NAME, LIB_NAME))
    return _write_wheel(wheel_directory,
                        [(f"{NAME}_editable.pth", (PY_DIR + "\n").encode(), 0o644)], pure=True)


def build_sdist(sdist_directory, config_settings=None):
    # The repository's layout, with what the library-only build needs: an sdist builds a wheel
    # the way a clone does (its root pyproject.toml points at python/_build).
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    _check_repository()

    def skip(info):
        parts = info.name.split("/")
        return None if "__pycache__" in parts or info.name.endswith(".pyc") else info

    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in SDIST_FILES + SDIST_DIRS:
            t.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}", filter=skip)
        for rel in ("pyproject.toml", "_build/expanse_build.py"):
            t.add(os.path.join(PY_DIR, rel), arcname=f"{base}/python/{rel}")
        for full, arcname in _package_files():
            t.add(full, arcname=f"{base}/python/{arcname}")
        pkg_info = os.path.join(sdist_directory, "PKG-INFO.tmp")
        with open(pkg_info, "wb") as f:
            f.write(_metadata())
        t.add(pkg_info, arcname=f"{base}/PKG-INFO")
        os.remove(pkg_info)
    return name
