#!/usr/bin/env bash
# Installs the Debian packages npullm's build, tests, benchmarks and demo need; with --bench,
# also what `make bench` draws its plots with (`make test` and `make demo` do not need it).
# Idempotent: installs only what is missing, runs `apt-get update` only when it must install.
set -euo pipefail

packages=(
  g++ cmake make ninja-build pkg-config  # toolchain (Ninja: faster rebuilds than make)
  libeigen3-dev                   # GEMM baseline, interop
  libxtensor-dev                  # interop
  nlohmann-json3-dev              # safetensors headers, config.json
  libze-dev                       # Level Zero loader (NPU backend)
  libgtest-dev                    # tests
  libbenchmark-dev                # benchmarks
)
if [ "${1:-}" = "--bench" ]; then
  packages+=(
    gnuplot-nox                   # make bench: PNG plots (pngcairo terminal, no X11)
    fonts-dejavu-core             # the plots' font
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "npullm: missing Debian packages: ${missing[*]}" >&2
  echo "npullm: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

echo "npullm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
