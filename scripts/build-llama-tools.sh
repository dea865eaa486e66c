#!/usr/bin/env bash
# Build llama.cpp's own C++ tools (llama-server, llama-bench) from the llama.cpp
# source inside the pinned llama-cpp-python sdist, with llama.cpp's DEFAULT CPU
# kernels (llamafile sgemm on, native CPU flags, Release): the "default build"
# that `speculative bench --peer llama-server` and `--peer llama-server-spec`
# compare against. Our own llama-cpp-python is built without llamafile for exact
# numerics (scripts/setup.sh); this build is deliberately the one llama.cpp users get.
#
#   bash scripts/build-llama-tools.sh            # prints the bin folder on stdout
#
# Cached under ${SPECULATIVE_LLAMA_TOOLS_CACHE:-~/.cache/speculative/llama-tools}/<version>-<arch>-<cpu key>/bin;
# a rerun returns at once. The build goes to a temporary folder that is renamed
# into place only when complete, so an interrupted build leaves no cache behind.
# Needs cmake, a C++17 compiler and pip (the sdist comes from the package index).
# About 6 minutes on 2 idle cores. JOBS=N overrides the parallel compile jobs.
# One deviation from the defaults: where the CPU advertises AMX but its tile
# instructions fault (seen in virtual machines), the build leaves AMX out; the
# server would otherwise die with SIGILL in llama.cpp's AMX kernels.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[llama-tools] %s\n' "$*" >&2; }

VERSION=$(sed -n 's/^LLAMA_CPP_VERSION=//p' scripts/setup.sh)
[ -n "$VERSION" ] || { say "cannot read LLAMA_CPP_VERSION from scripts/setup.sh"; exit 2; }
cpu_key=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -a) | sha256sum | cut -c1-12)
ROOT="${SPECULATIVE_LLAMA_TOOLS_CACHE:-${SPECULATIVE_CACHE_DIR:-$HOME/.cache/speculative}/llama-tools}"
amx_tag=""
if [ "${SPECULATIVE_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then amx_tag="-noamx"; fi
DEST="$ROOT/$VERSION-$(uname -m)-$cpu_key$amx_tag"
TOOLS="llama-server llama-bench"

complete() {
    for t in $TOOLS; do [ -x "$DEST/bin/$t" ] || return 1; done
}

if complete; then
    say "cached: $DEST/bin"
    echo "$DEST/bin"
    exit 0
fi

for tool in cmake; do
    command -v "$tool" >/dev/null || { say "$tool is needed (apt-get install cmake build-essential)"; exit 2; }
done
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi

mkdir -p "$ROOT"
WORK=$(mktemp -d "$DEST.tmp.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'say "interrupted; nothing cached"; exit 130' INT TERM

say "downloading the llama-cpp-python $VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/sdist"
SDIST=$(ls "$WORK"/sdist/llama_cpp_python-*.tar.gz)
say "extracting vendor/llama.cpp"
tar -xzf "$SDIST" -C "$WORK" --wildcards '*/vendor/llama.cpp/*'
SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp)

# llama.cpp's AMX kernels, which -march=native turns on where the CPU advertises AMX, fault with
# SIGILL on some virtual machines although a probe of the tile instructions passes there (seen on
# this project's CI machines): build without them, as scripts/setup.sh does; SPECULATIVE_LLAMA_AMX=1
# keeps them.
EXTRA_FLAGS=""
if [ "${SPECULATIVE_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    say "building without llama.cpp's AMX kernels (SPECULATIVE_LLAMA_AMX=1 keeps them)"
    EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
say "configuring (Release, llama.cpp's default CPU kernels)"
# No network in the build: no web UI download, no OpenSSL/HTTPS client, no tests or examples.
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_CXX_FLAGS="$EXTRA_FLAGS" \
    >"$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log" >&2; say "configure failed"; exit 1; }
say "building $TOOLS with $JOBS jobs (about 6 minutes on 2 idle cores)"
# shellcheck disable=SC2086
cmake --build "$WORK/build" --config Release -j "$JOBS" --target $TOOLS

mkdir -p "$WORK/out/bin"
for t in $TOOLS; do cp "$WORK/build/bin/$t" "$WORK/out/bin/"; done
{
    echo "llama-cpp-python $VERSION (vendor/llama.cpp), Release, default CPU kernels${EXTRA_FLAGS:+ except $EXTRA_FLAGS}"
    grep -E '^GGML_(NATIVE|LLAMAFILE):' "$WORK/build/CMakeCache.txt" || true
    "$WORK/out/bin/llama-server" --version 2>&1 | head -3 || true
} >"$WORK/out/build-info.txt"
# atomic publish: a rename; another process may have finished first, keep its copy
if ! mv -T "$WORK/out" "$DEST" 2>/dev/null; then
    complete || { rm -rf "$DEST"; mv -T "$WORK/out" "$DEST"; }
fi
complete || { say "build produced no $TOOLS"; exit 1; }
say "built: $DEST/bin"
echo "$DEST/bin"
