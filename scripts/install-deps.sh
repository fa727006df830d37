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
  libcpp-httplib-dev              # npullm_server (HTTP/1.1; the library llama-server builds on)
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

# node and npm for npullm_server's client tests (the official OpenAI client, tests/serve): the
# Debian packages where no node is installed (a node from elsewhere that brings its own npm is
# kept: Debian's npm would conflict with it).
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

# The npm packages of tests/serve, exactly as its lockfile pins them (npm ci), once.
install_client() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/serve"
  if [ -f "$dir/package-lock.json" ] && [ ! -f "$dir/node_modules/openai/package.json" ]; then
    echo "npullm: npm ci in tests/serve (the OpenAI client, pinned by package-lock.json)"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "npullm: npm ci failed: npullm_server's client tests will be skipped" >&2
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  install_client
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
install_client
