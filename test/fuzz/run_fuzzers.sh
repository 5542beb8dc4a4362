#!/usr/bin/env bash
# Builds the libFuzzer targets (test/fuzz/CMakeLists.txt: clang, ASan + UBSan) and runs each for
# a bounded time, seeded with the committed small inputs. Fails on the first crash, leak,
# sanitizer report or timeout, leaving the input that caused it under the build folder and
# naming it; copy it to test/fuzz/regressions/<target>/ so the unit tests replay it from then on.
#
#   test/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET [TARGET...]]
#       (default 30 s; targets pickle snapshot rmm_csv; env BUILD_DIR, default build-fuzz)
#
# c_abi (fuzz_c_abi: the C ABI and the sharing records, the whole library built here, which takes
# minutes on two cores) runs only when named; it runs four times as long (FUZZ_C_ABI_SECONDS
# overrides), seeded from test/fuzz/corpus/c_abi. CI runs the same harnesses seeded instead, in
# the unit tests under ASan and TSan (test/api/c_abi_fuzz_test.cpp, ipc_record_fuzz_test.cpp).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seconds="${1:-30}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(pickle snapshot rmm_csv)
build="${BUILD_DIR:-$root/build-fuzz}"

# clang and its libFuzzer / sanitizer runtimes, from Debian's packages.
missing=()
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "fuzz: missing ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "fuzz: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
CXX=clang++ cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null

data="$root/test/tools/data"
status=0
for target in "${targets[@]}"; do
  # Seeds: the committed inputs of that kind, every regression input; the corpus libFuzzer grows
  # lives in the build folder, so a run never changes the checkout.
  corpus="$build/corpus/$target"
  mkdir -p "$corpus" "$build/crashes/$target"
  case "$target" in
    pickle | snapshot) seeds=("$data"/*.pickle) ;;
    rmm_csv) seeds=("$here"/corpus/rmm_csv/*) ;;
    c_abi) seeds=("$here"/corpus/c_abi/*) ;;
  esac
  run_for="$seconds"
  max_len=16384
  if [ "$target" = c_abi ]; then
    # Each pair of bytes is one choice, a call a few of them: 4 KiB is hundreds of calls.
    run_for="${FUZZ_C_ABI_SECONDS:-$((seconds * 4))}"
    max_len=4096
  fi
  cp -f "${seeds[@]}" "$corpus/"
  if compgen -G "$here/regressions/$target/*" >/dev/null; then
    cp -f "$here/regressions/$target/"* "$corpus/"
  fi
  dict=()
  [ -f "$here/$target.dict" ] && dict=(-dict="$here/$target.dict")
  echo "fuzz: $target for ${run_for} s"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$build/fuzz_$target" "${dict[@]}" -max_total_time="$run_for" -timeout=20 -rss_limit_mb=4096 \
      -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$build/crashes/$target/" \
      "$corpus" >"$build/fuzz_$target.log" 2>&1; then
    echo "fuzz: $target FAILED; log $build/fuzz_$target.log, input(s):" >&2
    ls "$build/crashes/$target/" >&2
    tail -40 "$build/fuzz_$target.log" >&2
    status=1
  else
    grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs|stat::number_executed_units" "$build/fuzz_$target.log" | tail -2
  fi
done
exit "$status"
