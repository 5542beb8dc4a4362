#!/usr/bin/env bash
# Compiles expanse's native PyTorch allocator (python/expanse/native/torch_allocator.cpp) against
# the headers of real torch wheels, so that a change of PyTorch's CUDAAllocator interface breaks
# CI rather than a user's first expanse.torch.use(). Needs no GPU and no importable torch: each
# wheel is downloaded with `pip download torch==V --no-deps`, only its include folder and its two
# c10 libraries are unpacked, the source is compiled through the build's EXPANSE_TORCH_INCLUDE
# option, and, where this machine has the CUDA runtime those c10 libraries need
# (libcudart.so.<major>), the torch half runs on the sim against them (EXPANSE_TORCH_LIB:
# TorchNative.SmokeOnSim, test/torch_adapter/torch_native_smoke.cpp).
#
#   test/torch_compile_check.sh [VERSION ...]    (default: the newest torch on the index, and 2.11.0)
#
# Environment: WORK (downloads and builds; default /tmp/expanse-torch-check), KEEP_WHEELS=1 keeps
# the wheels (about 1 GB each; by default only their headers are kept), PIP (default
# "python3 -m pip"). Needs the CUDA toolkit's headers (c10/cuda includes cuda_runtime_api.h).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/expanse-torch-check}
PIP=${PIP:-python3 -m pip}
mkdir -p "$WORK"

# Unpacks torch/include and torch/lib/libc10{,_cuda}.so of wheel $1 into folder $2.
unpack_headers() {
  rm -rf "$2" && mkdir -p "$2"
  python3 - "$1" "$2" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
keep = ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so")
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/") or n in keep])
PY
}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  # The newest release: the one pip itself picks for this Python.
  rm -rf "$WORK/newest"
  $PIP download torch --no-deps -d "$WORK/newest" -q
  newest=$(ls "$WORK/newest" | sed -n 's/^torch-\([0-9][0-9.]*[0-9]\).*\.whl$/\1/p' | head -1)
  if [ -z "$newest" ]; then
    echo "torch_compile_check: pip download torch gave no torch wheel in $WORK/newest" >&2
    exit 1
  fi
  versions=("$newest")
  [ "$newest" = 2.11.0 ] || versions+=(2.11.0)
fi

status=0
for v in "${versions[@]}"; do
  t0=$(date +%s)
  inc="$WORK/torch-$v"
  if [ ! -f "$inc/torch/include/torch/csrc/api/include/torch/version.h" ] ||
     [ ! -f "$inc/torch/lib/libc10_cuda.so" ]; then
    wheel=$(ls "$WORK"/newest/torch-"$v"-*.whl "$WORK"/wheels-"$v"/torch-"$v"-*.whl 2>/dev/null \
              | head -1 || true)
    if [ -z "$wheel" ]; then
      $PIP download "torch==$v" --no-deps -d "$WORK/wheels-$v" -q
      wheel=$(ls "$WORK"/wheels-"$v"/torch-"$v"-*.whl | head -1)
    fi
    unpack_headers "$wheel" "$inc"
    [ "${KEEP_WHEELS:-0}" = 1 ] || rm -f "$wheel"
  fi
  # One build folder for every version: expanse itself is built once, only the torch targets
  # follow EXPANSE_TORCH_INCLUDE / EXPANSE_TORCH_LIB.
  b="$WORK/build"
  lib=""
  missing=$(ldd "$inc/torch/lib/libc10_cuda.so" | sed -n 's/^[[:space:]]*\([^ ]*\) => not found/\1/p' \
              | grep -v '^libc10\.so$' | tr '\n' ' ' || true)
  if [ -z "$missing" ]; then lib="$inc/torch/lib"; fi
  echo "==== torch $v: compiling the native allocator against $inc/torch/include"
  if cmake -S "$SRC" -B "$b" -DCMAKE_BUILD_TYPE=Release -DEXPANSE_WERROR=ON \
        -DEXPANSE_BUILD_BENCH=OFF -DEXPANSE_BUILD_EXAMPLES=OFF -DEXPANSE_BUILD_CUDA_TESTS=OFF \
        -DEXPANSE_TORCH_INCLUDE="$inc/torch/include" -DEXPANSE_TORCH_LIB="$lib" \
        >"$b.configure-$v.log" 2>&1 &&
     cmake --build "$b" --target expanse_torch_native_check; then
    echo "==== torch $v: compiles ($(( $(date +%s) - t0 )) s)"
  else
    echo "==== torch $v: FAILED to compile ($(( $(date +%s) - t0 )) s; configure log: $b.configure-$v.log)"
    status=1
    continue
  fi
  if [ -z "$lib" ]; then
    echo "==== torch $v: smoke test on the sim skipped: its libc10_cuda.so needs $missing(not on this machine)"
  elif cmake --build "$b" -j"$(nproc)" --target expanse_torch_native_smoke &&
       "$b/bin/expanse_torch_native_smoke"; then
    echo "==== torch $v: smoke test on the sim ok ($(( $(date +%s) - t0 )) s)"
  else
    echo "==== torch $v: smoke test on the sim FAILED ($(( $(date +%s) - t0 )) s)"
    status=1
  fi
done
exit $status
