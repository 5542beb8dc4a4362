#!/usr/bin/env bash
# Every check that needs a real GPU, run from a build made on another x86-64 machine (this is
# what a session runs on the `device` tool's lent H100/H200; results go to test/gpu/RESULTS.md):
#   nvidia-smi, `expanse info`, `expanse stress` (32 GiB on an 80 GiB GPU) and `expanse stress
#   --reserve free` (the same request with the GPU's free memory held up front, beside the run
#   without it: at most 1.1 x its time, test/gpu/stress_reserve_check.py), PyTorch with expanse as
#   its native allocator built as a new user's first use() builds it (torch-native), the
#   conformance suite's real-driver variant (every rule's answers are shown, a rule that crashes
#   the driver is one failure naming its last call and the run goes on: rc 1 is rules that
#   disagree, rc >= 128 a crash), sleep and wake of 1, 8 and 40 GiB pools, pinned host memory
#   with PyTorch (test/gpu/pinned_host_checks.py), GPT-2 with varying
#   shapes under PyTorch's allocators and expanse (test/gpu/gpt2_check.py), then the nvcc tests
#   (Thrust's CUDA backend; invariant 3 under running kernels), PyTorch through the pluggable pair
#   (torch-checks), `expanse selftest` (checks + cost calibration), the hot path on the real driver
#   next to the sim on the same machine.
#
#   test/gpu/run_on_gpu.sh BUILD_DIR OUT_DIR [STEP|PROFILE ...]
#
# No STEP: every step except those run only when named. Steps run in this file's order, whatever
# the order they are named in.
#   Profile `quick`: info stress stress-reserve torch-native conformance-cuda sleep-wake-cuda
#   pinned-host gpt2,
#   what a lent GPU runs first (a loan is 15 minutes, the machine's start included; estimated
#   from the H200 run: about 4 minutes for the first six, 70 s for gpt2); `quick peers` adds
#   peers after them.
#   Run only when named: `conformance` (the whole suite, the sims' variants too: CI runs those)
#   and `peers`, which builds bench/peers on the GPU machine and runs expanse beside
#   cudaMallocAsync, PyTorch's and RMM's allocators (test/gpu/peers.sh; BUILD_DIR is not used by
#   it): it builds for minutes and runs for minutes, more than a run of every step can spare.
#
# Writes OUT_DIR/summary.txt (one line per step: exit code, milliseconds), OUT_DIR/gpu_checks.log
# (everything printed), stress.json, stress_reserve.json, stress_pinned.json (`expanse stress
# --pinned`: the host pool fragmented, then one contiguous buffer), conformance_cuda.json, gpt2.json and
# selftest.json. Exits 1 if any step failed, 2 on an unknown step name.
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

ALL_STEPS=(nvidia-smi info stress stress-reserve torch-native conformance-cuda sleep-wake-cuda
           pinned-host gpt2 stress-pinned stream-safety thrust-cuda conformance torch-checks
           torch-example pytest selftest stress-measured hot-path-cuda hot-path-sim peers)
NAMED_ONLY=(conformance peers)
QUICK=(info stress stress-reserve torch-native conformance-cuda sleep-wake-cuda pinned-host gpt2)

in_list() {
  local want=$1 s; shift
  for s in "$@"; do [ "$s" = "$want" ] && return 0; done; return 1
}

steps=()
for a in "$@"; do
  if [ "$a" = quick ]; then
    steps+=("${QUICK[@]}")
  elif in_list "$a" "${ALL_STEPS[@]}"; then
    steps+=("$a")
  else
    echo "run_on_gpu.sh: unknown step '$a' (steps: ${ALL_STEPS[*]}; profile: quick)" >&2
    exit 2
  fi
done

selected() {
  if [ ${#steps[@]} -eq 0 ]; then
    ! in_list "$1" "${NAMED_ONLY[@]}"
  else
    in_list "$1" "${steps[@]}"
  fi
}

# step NAME TIMEOUT CMD...: runs CMD, appends its output to the log, one summary line.
step() {
  local name=$1 limit=$2; shift 2
  if ! in_list "$name" "${ALL_STEPS[@]}"; then
    echo "run_on_gpu.sh: step '$name' is missing from ALL_STEPS" >&2
    exit 2
  fi
  selected "$name" || return 0
  echo "==== $name: $*" >>"$LOG"
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-24s rc=%-4d %8d ms\n' "$name" "$rc" "$ms" | tee -a "$SUM"
  [ "$rc" -eq 0 ] || failed=1
}

# The native PyTorch allocator is built as a new user's first expanse.torch.use() builds it:
# none of the variables that steer a compile or point at CUDA, nor expanse's header and
# build-folder overrides, so expanse.torch alone chooses the CUDA headers (torch-native prints
# its choice). Its build cache is this run's own (XDG_CACHE_HOME), so torch-native compiles it
# here rather than taking an earlier run's build, and gpt2 reuses that build. EXPANSE_LIBRARY
# stays: it names which libexpanse.so is loaded and linked (this build's; without it the package
# would find the same one on LD_LIBRARY_PATH), not where any header comes from. EXPANSE_CONF is
# the run-time driver.
NATIVE_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/expanse-native-cache.XXXXXX")
trap 'rm -rf "$NATIVE_CACHE"' EXIT
native_env=(env -u CUDA_HOME -u CUDA_PATH -u CUDA_ROOT -u CPATH -u C_INCLUDE_PATH
            -u CPLUS_INCLUDE_PATH -u CC -u CXX -u CFLAGS -u CXXFLAGS -u LDFLAGS
            -u EXPANSE_INCLUDE -u EXPANSE_TORCH_BUILD_DIR -u TORCH_EXTENSIONS_DIR
            XDG_CACHE_HOME="$NATIVE_CACHE" EXPANSE_CONF=driver:cuda
            EXPANSE_LIBRARY="$B/lib/libexpanse.so")

step nvidia-smi 60 nvidia-smi
step info 60 env EXPANSE_CONF=driver:cuda "$B/bin/expanse" info
step stress 300 sh -c "EXPANSE_CONF=driver:cuda '$B/bin/expanse' stress --json > '$OUT/stress.json'; rc=\$?; cat '$OUT/stress.json'; exit \$rc"
step stress-reserve 300 sh -c "EXPANSE_CONF=driver:cuda '$B/bin/expanse' stress --reserve free --json > '$OUT/stress_reserve.json'; rc=\$?; cat '$OUT/stress_reserve.json'; [ \$rc -eq 0 ] || exit \$rc; python3 '$SRC/test/gpu/stress_reserve_check.py' '$OUT/stress_reserve.json'"
step torch-native 400 "${native_env[@]}" python3 "$SRC/test/gpu/torch_native_checks.py"
step conformance-cuda 300 "$B/bin/expanse_conformance_tests" --gtest_filter='*/cuda*' \
  --gtest_brief=1 --gtest_output="json:$OUT/conformance_cuda.json"
step sleep-wake-cuda 300 env EXPANSE_BENCH_CONF=driver:cuda "$B/bin/expanse_bench_sleep_wake" 1 8 40
step pinned-host 240 "${native_env[@]}" python3 "$SRC/test/gpu/pinned_host_checks.py"
step gpt2 240 "${native_env[@]}" python3 "$SRC/test/gpu/gpt2_check.py" --out "$OUT/gpt2.json"
step stress-pinned 300 sh -c "EXPANSE_CONF=driver:cuda '$B/bin/expanse' stress --pinned --json > '$OUT/stress_pinned.json'; rc=\$?; cat '$OUT/stress_pinned.json'; exit \$rc"
step stream-safety 180 env EXPANSE_CONF=driver:cuda "$B/bin/expanse_gpu_stream_safety_test"
step thrust-cuda 120 env EXPANSE_CONF=driver:cuda "$B/bin/expanse_thrust_cuda_test"
step conformance 300 "$B/bin/expanse_conformance_tests" --gtest_brief=1
step torch-checks 400 env EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY="$B/lib/libexpanse.so" python3 "$SRC/test/python/torch_gpu_checks.py"
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
step peers 580 "$SRC/test/gpu/peers.sh" "$OUT"
exit $failed
