#!/usr/bin/env bash
# Every check that needs a real GPU, run from a build made on another x86-64 machine (this is
# what a session runs on the `device` tool's lent H100/H200; results go to test/gpu/RESULTS.md):
#   nvidia-smi, `expanse info`, the conformance suite (every rule's answers are shown, a rule
#   that crashes the driver is one failure naming its last call and the run goes on), `expanse
#   selftest` (checks + cost calibration), `expanse stress` (32 GiB on an 80 GiB GPU), the nvcc
#   tests (Thrust's CUDA backend; invariant 3 under running kernels), the hot path on the real
#   driver next to the sim on the same machine, sleep and wake of 1, 8 and 40 GiB pools, and PyTorch with expanse as its allocator
#   (torch-checks: the pluggable pair; torch-native: the native allocator). The step `peers`
#   builds bench/peers on the GPU machine and runs expanse beside cudaMallocAsync, PyTorch's and
#   RMM's allocators (test/gpu/peers.sh; BUILD_DIR is not used by it). It runs only when named:
#   it builds for minutes and runs for minutes, more than a run of every step can spare.
#
#   test/gpu/run_on_gpu.sh BUILD_DIR OUT_DIR [STEP ...]     (no STEP: all of them)
#
# Writes OUT_DIR/summary.txt (one line per step: exit code, seconds), OUT_DIR/gpu_checks.log
# (everything printed), selftest.json and stress.json. Exits 1 if any step failed.
set -u
B=$(cd "${1:?build dir}" && pwd)
OUT=${2:?output dir}
shift 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_checks.log
SUM=$OUT/summary.txt
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export LD_LIBRARY_PATH=$B/lib:$B/runtime-libs:${LD_LIBRARY_PATH:-}
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
failed=0

steps=("$@")
selected() {
  [ ${#steps[@]} -eq 0 ] && return 0
  local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1
}

# step NAME TIMEOUT CMD...: runs CMD, appends its output to the log, one summary line.
step() {
  local name=$1 limit=$2; shift 2
  selected "$name" || return 0
  echo "==== $name: $*" >>"$LOG"
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-24s rc=%-4d %8d ms\n' "$name" "$rc" "$ms" | tee -a "$SUM"
  [ "$rc" -eq 0 ] || failed=1
}

step nvidia-smi 60 nvidia-smi
step info 60 env EXPANSE_CONF=driver:cuda "$B/bin/expanse" info
step stream-safety 180 env EXPANSE_CONF=driver:cuda "$B/bin/expanse_gpu_stream_safety_test"
step thrust-cuda 120 env EXPANSE_CONF=driver:cuda "$B/bin/expanse_thrust_cuda_test"
step conformance 300 "$B/bin/expanse_conformance_tests" --gtest_brief=1
step stress 300 sh -c "EXPANSE_CONF=driver:cuda '$B/bin/expanse' stress --json > '$OUT/stress.json'; rc=\$?; cat '$OUT/stress.json'; exit \$rc"
step torch-checks 400 env EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY="$B/lib/libexpanse.so" python3 "$SRC/test/python/torch_gpu_checks.py"
step torch-native 400 env EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY="$B/lib/libexpanse.so" python3 "$SRC/test/gpu/torch_native_checks.py"
step torch-example 300 env EXPANSE_CONF=driver:cuda python3 "$SRC/examples/pytorch/expanse_with_pytorch.py" "$B/lib/libexpanse.so"
step pytest 300 env EXPANSE_LIBRARY="$B/lib/libexpanse.so" EXPANSE_CLI="$B/bin/expanse" \
  EXPANSE_CONF=driver:sim,sim_capacity:1GiB EXPANSE_TORCH_CONF=driver:cuda \
  python3 -m pytest -q -p no:cacheprovider -rs "$SRC/test/python"
step selftest 400 env EXPANSE_CONF=driver:cuda "$B/bin/expanse" selftest --report "$OUT/selftest.json"
step stress-measured 300 env EXPANSE_CONF=driver:cuda "$B/bin/expanse" stress --cost-table "$OUT/selftest.json"
step hot-path-cuda 300 env EXPANSE_BENCH_CONF=driver:cuda "$B/bin/expanse_bench_hot_path" \
  --benchmark_filter='expanse/(4096|1048576|16777216)/' --benchmark_min_time=0.2
step hot-path-sim 300 "$B/bin/expanse_bench_hot_path" \
  --benchmark_filter='expanse/(4096|1048576|16777216)/' --benchmark_min_time=0.2
if [ ${#steps[@]} -gt 0 ]; then
  step peers 580 "$SRC/test/gpu/peers.sh" "$OUT"
fi
step sleep-wake-cuda 300 env EXPANSE_BENCH_CONF=driver:cuda "$B/bin/expanse_bench_sleep_wake" 1 8 40
exit $failed
