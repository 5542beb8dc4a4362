#!/usr/bin/env bash
# Compiles expanse's native PyTorch allocator (python/expanse/native/torch_allocator.cpp) against
# the headers of real torch wheels, so that a change of PyTorch's CUDAAllocator interface breaks
# CI rather than a user's first expanse.torch.use(). Needs no GPU and no importable torch: each
# wheel is downloaded with `pip download torch==V --no-deps`, only its include folder, its two
# c10 libraries and libtorch_cpu (with its libgomp) are unpacked, the source is compiled through
# the build's EXPANSE_TORCH_INCLUDE option, and, where this machine has the CUDA runtime those
# c10 libraries need
# (libcudart.so.<major>), the torch half runs on the sim against them (EXPANSE_TORCH_LIB:
# TorchNative.SmokeOnSim, test/torch_adapter/torch_native_smoke.cpp), and so does the host
# allocator against libtorch_cpu (test/torch_adapter/torch_host_smoke.cpp).
#
#   test/torch_compile_check.sh [VERSION ...]    (default: the newest torch on the index, and 2.11.0)
#
# Environment: WORK (downloads, shared by every checkout; default /tmp/expanse-torch-check), BUILD
# (the build folder; default build-torch-check in this checkout, since a CMake cache belongs to one
# source folder and WORK may be shared by several checkouts; a folder configured already keeps
# its options and only gains the torch targets), KEEP_WHEELS=1 keeps
# the wheels (about 1 GB each; by default only their headers are kept), PIP (default
# "python3 -m pip"). Needs the CUDA toolkit's headers (c10/cuda includes cuda_runtime_api.h).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/expanse-torch-check}
PIP=${PIP:-python3 -m pip}
mkdir -p "$WORK"
# Downloads go to a folder of this run's own: several checkouts may run this script at once.
dl="$WORK/download.$$"
trap 'rm -rf "$dl" "$WORK"/unpack.$$.*' EXIT

# Unpacks torch/include and torch/lib/libc10{,_cuda}.so of wheel $1 into folder $2, through a
# folder of this run's own renamed into place, so that a concurrent run never sees half of it.
unpack_headers() {
  local tmp="$WORK/unpack.$$.$(basename "$2")"
  rm -rf "$tmp" && mkdir -p "$tmp"
  python3 - "$1" "$tmp" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
keep = ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so", "torch/lib/libtorch_cpu.so",
        "torch/lib/libgomp.so.1")
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/") or n in keep])
PY
  rm -rf "$2" && mv "$tmp" "$2"
}
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  # The newest release: the one pip itself picks for this Python.
  $PIP download torch --no-deps -d "$dl/newest" -q
  newest=$(ls "$dl/newest" | sed -n 's/^torch-\([0-9][0-9.]*[0-9]\).*\.whl$/\1/p' | head -1)
  if [ -z "$newest" ]; then
    echo "torch_compile_check: pip download torch gave no torch wheel in $dl/newest" >&2
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
     [ ! -f "$inc/torch/lib/libc10_cuda.so" ] || [ ! -f "$inc/torch/lib/libtorch_cpu.so" ]; then
    wheel=$(ls "$dl"/newest/torch-"$v"-*.whl "$WORK"/wheels-"$v"/torch-"$v"-*.whl 2>/dev/null \
              | head -1 || true)
    if [ -z "$wheel" ]; then
      $PIP download "torch==$v" --no-deps -d "$dl/wheels-$v" -q
      wheel=$(ls "$dl"/wheels-"$v"/torch-"$v"-*.whl | head -1)
    fi
    unpack_headers "$wheel" "$inc"
    if [ "${KEEP_WHEELS:-0}" = 1 ] && [ "$(dirname "$wheel")" != "$WORK/wheels-$v" ]; then
      mkdir -p "$WORK/wheels-$v" && mv "$wheel" "$WORK/wheels-$v/"
    fi
  fi
  # One build folder for every version: expanse itself is built once, only the torch targets
  # follow EXPANSE_TORCH_INCLUDE / EXPANSE_TORCH_LIB.
  b=${BUILD:-$SRC/build-torch-check}
  mkdir -p "$b"
  lib=""
  missing=$(ldd "$inc/torch/lib/libc10_cuda.so" | sed -n 's/^[[:space:]]*\([^ ]*\) => not found/\1/p' \
              | grep -v '^libc10\.so$' | tr '\n' ' ' || true)
  if [ -z "$missing" ]; then lib="$inc/torch/lib"; fi
  # The host allocator's smoke test links libtorch_cpu (at::setHostAllocator): built only where
  # its own dependencies are on this machine.
  host_missing=$(ldd "$inc/torch/lib/libtorch_cpu.so" 2>/dev/null |
                   sed -n 's/^[[:space:]]*\([^ ]*\) => not found/\1/p' |
                   grep -v '^libc10\.so$' | tr '\n' ' ' || true)
  echo "==== torch $v: compiling the native allocator against $inc/torch/include"
  # A folder configured already (CI passes its Release build) keeps its options and its built
  # library: only the torch targets are added; a new one builds no more than they need.
  opts=(-DEXPANSE_TORCH_INCLUDE="$inc/torch/include" -DEXPANSE_TORCH_LIB="$lib")
  if [ ! -f "$b/CMakeCache.txt" ]; then
    opts+=(-DCMAKE_BUILD_TYPE=Release -DEXPANSE_WERROR=ON -DEXPANSE_BUILD_BENCH=OFF
           -DEXPANSE_BUILD_EXAMPLES=OFF -DEXPANSE_BUILD_CUDA_TESTS=OFF)
  fi
  if cmake -S "$SRC" -B "$b" "${opts[@]}" >"$b/configure-torch-$v.log" 2>&1 &&
     cmake --build "$b" --target expanse_torch_native_check; then
    echo "==== torch $v: compiles ($(( $(date +%s) - t0 )) s)"
  else
    echo "==== torch $v: FAILED to compile ($(( $(date +%s) - t0 )) s); the end of the configure log, $b/configure-torch-$v.log:"
    tail -n 20 "$b/configure-torch-$v.log" | sed 's/^/    /'
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
  if [ -z "$lib" ]; then
    :
  elif [ -n "$host_missing" ]; then
    echo "==== torch $v: host allocator test skipped: its libtorch_cpu.so needs $host_missing(not on this machine)"
  elif cmake --build "$b" -j"$(nproc)" --target expanse_torch_host_smoke &&
       "$b/bin/expanse_torch_host_smoke"; then
    echo "==== torch $v: host allocator on the sim ok ($(( $(date +%s) - t0 )) s)"
  else
    echo "==== torch $v: host allocator on the sim FAILED ($(( $(date +%s) - t0 )) s)"
    status=1
  fi
done
exit $status
