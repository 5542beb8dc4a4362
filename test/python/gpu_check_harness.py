"""The harness of the scripts that check expanse with PyTorch on a real GPU (torch_gpu_checks.py
here, test/gpu/torch_native_checks.py): skip (exit 77) without PyTorch or a GPU, run checks in
order printing ok / FAIL / note, and exit 1 if any check failed."""
import os
import pathlib
import sys
import time
import traceback

SKIP = 77
failures = []


def torch_on_a_gpu():
    """PyTorch, with this checkout's expanse package importable; exits 77 without PyTorch or a
    GPU (so ctest and run_on_gpu.sh count the script as skipped)."""
    os.environ.setdefault("EXPANSE_CONF", "driver:cuda")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU for PyTorch")
        sys.exit(SKIP)
    return torch


def check(name, fn):
    """A behaviour required: fn() returns an optional detail or raises."""
    t0 = time.perf_counter()
    try:
        detail = fn()
        print(f"ok    {name} ({time.perf_counter() - t0:.2f} s){': ' + detail if detail else ''}")
    except Exception as e:  # noqa: BLE001
        failures.append(name)
        print(f"FAIL  {name}: {type(e).__name__}: {e}")
        traceback.print_exc(limit=3)
    sys.stdout.flush()


def note(name, fn):
    """A behaviour documented rather than required: print what PyTorch did."""
    try:
        print(f"note  {name}: {fn()}")
    except Exception as e:  # noqa: BLE001
        print(f"note  {name}: raises {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.stdout.flush()


def finish():
    print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failure(s) {failures}")
    sys.exit(1 if failures else 0)
