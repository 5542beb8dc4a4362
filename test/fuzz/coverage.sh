#!/usr/bin/env bash
# Line coverage of the C ABI fuzz target: builds fuzz_c_abi with llvm-cov instrumentation (a
# folder of its own), fuzzes for SECONDS from the committed corpus (growing a copy of it), replays
# what it grew, and prints llvm-cov's line coverage of src/api and src/core with the executions.
#
#   test/fuzz/coverage.sh [SECONDS]     (default 600; env BUILD_DIR, default build-fuzz-cov)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seconds="${1:-600}"
build="${BUILD_DIR:-$root/build-fuzz-cov}"

CXX=clang++ cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEXPANSE_FUZZ_COVERAGE=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_c_abi >/dev/null

corpus="$build/corpus"
mkdir -p "$corpus"
cp -f "$here"/corpus/c_abi/* "$corpus/"
rm -f "$build"/*.profraw
export ASAN_OPTIONS=detect_leaks=0 LLVM_PROFILE_FILE="$build/fuzz-%p.profraw"
"$build/fuzz_c_abi" -max_total_time="$seconds" -max_len=4096 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 "$corpus" 2>"$build/fuzz.log" || { tail -40 "$build/fuzz.log"; exit 1; }
grep -E "stat::number_executed_units|^#[0-9]+.*DONE" "$build/fuzz.log" | tail -2
echo "corpus: $(ls "$corpus" | wc -l) inputs"
llvm-profdata merge -sparse "$build"/*.profraw -o "$build/fuzz.profdata"
for dir in api core; do
  echo "src/$dir:"
  llvm-cov report "$build/fuzz_c_abi" -instr-profile="$build/fuzz.profdata" "$root/src/$dir" |
    sed -n '1p;$p'
done
