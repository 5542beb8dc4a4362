#!/bin/sh
# Installs the Debian packages expanse needs to build, test and benchmark that are not installed
# yet; the one list of them (README's Quick start and .ci/run both call this). Needs root, or
# sudo where there is one. Non-interactive: never prompts. Downloads Debian packages only.
# The CUDA toolkit is not a Debian package here: it is expected under /usr/local/cuda (headers
# only are needed to build; nothing links libcuda).
set -eu

packages="cmake g++ make pkg-config libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
nlohmann-json3-dev python3 python3-pip python3-pytest python3-venv"

missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=""
  elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
  else
    echo "install_deps: need root (or sudo) to install:$missing" >&2
    exit 1
  fi
  echo "install_deps: installing$missing"
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086  # the list is split on purpose
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $missing >/dev/null
fi

if [ ! -f /usr/local/cuda/include/cuda.h ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "install_deps: the CUDA toolkit is missing (expected /usr/local/cuda/include/cuda.h)" >&2
  exit 1
fi
