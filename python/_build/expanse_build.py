"""A PEP 517 build backend for the expanse package, standard library only.

The package is a folder of .py files; a wheel is a zip of it plus three metadata files. Writing
it here keeps `pip install ./python` free of downloads (pip's build isolation would otherwise
fetch setuptools).
"""
import base64
import hashlib
import os
import tarfile
import zipfile

NAME = "expanse"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "py3-none-any"


def _package_files():
    root = os.path.join(HERE, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") or f == "py.typed":
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Python bindings of expanse, a virtual-memory GPU allocator\n"
            "Requires-Python: >=3.8\n").encode()


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: expanse_build\nRoot-Is-Purelib: true\n"
            f"Tag: {TAG}\n").encode()


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _dist_info():
    return f"{NAME}-{VERSION}.dist-info"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "wb") as f:
        f.write(_wheel_file())
    return _dist_info()


def _write_wheel(wheel_directory, entries):
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in entries:
            z.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        for arcname, data in ((f"{_dist_info()}/METADATA", _metadata()),
                              (f"{_dist_info()}/WHEEL", _wheel_file())):
            z.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        record = f"{_dist_info()}/RECORD"
        z.writestr(record, "\n".join(records + [f"{record},,"]) + "\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for full, arcname in _package_files():
        with open(full, "rb") as f:
            entries.append((arcname, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file that puts this folder on sys.path.
    return _write_wheel(wheel_directory, [(f"{NAME}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "_build/expanse_build.py"):
            t.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        for full, arcname in _package_files():
            t.add(full, arcname=f"{base}/{arcname}")
        pkg_info = os.path.join(sdist_directory, "PKG-INFO.tmp")
        with open(pkg_info, "wb") as f:
            f.write(_metadata())
        t.add(pkg_info, arcname=f"{base}/PKG-INFO")
        os.remove(pkg_info)
    return name
