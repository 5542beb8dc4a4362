#!/usr/bin/env bash
# run_on_gpu.sh's step `peers`: builds bench/peers/expanse_peers_bench on this machine (its own
# build folder, only what the program needs: no tests, CLI or other benchmarks, so neither
# GoogleTest nor CLI11 is needed) and runs it on recorded traces. PyTorch comes from python3's
# torch; RMM from its wheels carried in build-peers-input/rmm/ (librmm-cu13 and rapids-logger,
# unpacked here; RMM left out if absent).
#
#   test/gpu/peers.sh OUT_DIR        (writes OUT_DIR/peers.txt)
#
# Traces: EXPANSE_PEER_TRACES (paths, space-separated) if set; else shared/traces/pytorch/*.pickle
# inside the checkout; else build-peers-input/traces/*.pickle (carried: build-* is ignored by
# git, so the folder travels only when the device call's carry names it); else the repository's
# small test snapshot (test/tools/data/snapshot_p4.pickle).
#
# What the device call carries (the folder is ignored by git: build-*), prepared in the checkout:
#   mkdir -p build-peers-input/rmm build-peers-input/traces
#   (cd build-peers-input/rmm && python3 -m pip download --no-deps --only-binary=:all: \
#      librmm-cu13==26.10.0 'rapids-logger==0.3.*')                # about 5 MB
#   cp ../shared/traces/pytorch/*.pickle build-peers-input/traces/   # about 9 MB
# then: carry ["build-peers-input"], command test/gpu/run_on_gpu.sh . "$OUT" peers
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(cd "${1:?output dir}" && pwd)
IN=$SRC/build-peers-input
BUILD=${EXPANSE_PEERS_BUILD:-$SRC/build-peers}

rmm_dirs=""
if compgen -G "$IN/rmm/*.whl" >/dev/null; then
  for w in "$IN"/rmm/*.whl; do
    python3 -m zipfile -e "$w" "$BUILD/rmm-wheels/$(basename "$w" .whl)"
  done
  # Each package's prefix: the folder holding lib64/cmake/<package>/.
  for c in "$BUILD"/rmm-wheels/*/*/lib64/cmake; do rmm_dirs="$rmm_dirs;${c%/lib64/cmake}"; done
fi
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEXPANSE_BUILD_TESTS=OFF \
  -DEXPANSE_BUILD_CLI=OFF -DEXPANSE_BUILD_BENCH=OFF -DEXPANSE_BUILD_EXAMPLES=OFF \
  -DEXPANSE_BUILD_PEER_BENCH=ON "-DEXPANSE_PEER_RMM_DIRS=${rmm_dirs#;}"
cmake --build "$BUILD" -j"$(nproc)" --target expanse_peers_bench

if [ -n "${EXPANSE_PEER_TRACES:-}" ]; then
  read -r -a traces <<<"$EXPANSE_PEER_TRACES"
elif compgen -G "$SRC/shared/traces/pytorch/*.pickle" >/dev/null; then
  traces=("$SRC"/shared/traces/pytorch/*.pickle)
elif compgen -G "$IN/traces/*.pickle" >/dev/null; then
  traces=("$IN"/traces/*.pickle)
else
  traces=("$SRC/test/tools/data/snapshot_p4.pickle")
fi
# This build's libexpanse.so, not the one of the build run_on_gpu.sh was given.
export LD_LIBRARY_PATH=$BUILD/lib:${LD_LIBRARY_PATH:-}
set -o pipefail
"$BUILD/bin/expanse_peers_bench" "${traces[@]}" | tee "$OUT/peers.txt"
