#!/usr/bin/env bash
# Build the STOCK llama-cpp-python (the pinned version, pip's default build options: no CMAKE_ARGS,
# so llama.cpp's default CPU kernels, llamafile sgemm and native flags) into a folder of its own,
# apart from the project's .venv, whose llama-cpp-python carries our patch. The bench's
# `--peer llama-cpp-python-stock` runs it in a subprocess (src/speculative/bench/stock_worker.py),
# so an in-process llama-cpp-python peer is available that we did not modify.
#
#   bash scripts/build-stock-llama-cpp-python.sh      # prints the site folder on stdout
#
# Cached under ${SPECULATIVE_STOCK_LLAMA_CACHE:-~/.cache/speculative/stock-llama-cpp-python}/
# <version>-py<X.Y>-<arch>-<cpu key>/site (pip install --target, with its dependencies); a rerun
# returns at once. The build goes to a temporary folder renamed into place only when complete,
# so an interrupted build leaves no cache behind. Never run by the set-up or the tests: the bench
# builds it on first use (about 5 minutes on 2 idle cores). Needs cmake, a C++ compiler and the
# package index. One deviation from the defaults, as in build-llama-tools.sh: where the CPU
# advertises AMX but its tile instructions fault (seen in virtual machines), AMX is left out.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[stock-llama-cpp-python] %s\n' "$*" >&2; }

VERSION=$(sed -n 's/^LLAMA_CPP_VERSION=//p' scripts/setup.sh)
[ -n "$VERSION" ] || { say "cannot read LLAMA_CPP_VERSION from scripts/setup.sh"; exit 2; }
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cpu_key=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -a) | sha256sum | cut -c1-12)
ROOT="${SPECULATIVE_STOCK_LLAMA_CACHE:-${SPECULATIVE_CACHE_DIR:-$HOME/.cache/speculative}/stock-llama-cpp-python}"
amx_tag=""
if [ "${SPECULATIVE_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then amx_tag="-noamx"; fi
DEST="$ROOT/$VERSION-py$PYVER-$(uname -m)-$cpu_key$amx_tag"

complete() { [ -f "$DEST/site/llama_cpp/__init__.py" ] && [ -f "$DEST/build-info.txt" ]; }

if complete; then
    say "cached: $DEST/site"
    echo "$DEST/site"
    exit 0
fi

command -v cmake >/dev/null || { say "cmake is needed (apt-get install cmake build-essential)"; exit 2; }

mkdir -p "$ROOT"
WORK=$(mktemp -d "$DEST.tmp.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'say "interrupted; nothing cached"; exit 130' INT TERM

EXTRA=()
if [ -n "$amx_tag" ]; then
    say "building without llama.cpp's AMX kernels (SPECULATIVE_LLAMA_AMX=1 keeps them)"
    EXTRA=(env CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'")
fi
say "building llama-cpp-python $VERSION from its sdist with its default options (about 5 minutes on 2 idle cores)"
# CMAKE_ARGS and FORCE_CMAKE from the caller's environment would change the build: drop them.
# --no-cache-dir: pip's wheel cache does not key on build flags and may hold our patched wheel's twin.
env -u CMAKE_ARGS -u FORCE_CMAKE "${EXTRA[@]}" "$PY" -m pip install -q --no-cache-dir --no-binary llama-cpp-python \
    --target "$WORK/out/site" "llama-cpp-python==$VERSION" >"$WORK/build.log" 2>&1 \
    || { tail -20 "$WORK/build.log" >&2; say "build failed"; exit 1; }
{
    echo "llama-cpp-python $VERSION, pip install --no-binary llama-cpp-python with no CMAKE_ARGS (default build)${amx_tag:+, AMX left out}"
    echo "python $PYVER ($("$PY" -c 'import sys; print(sys.base_prefix)'))"
} >"$WORK/out/build-info.txt"
# atomic publish: a rename; another process may have finished first, keep its copy
if ! mv -T "$WORK/out" "$DEST" 2>/dev/null; then
    complete || { rm -rf "$DEST"; mv -T "$WORK/out" "$DEST"; }
fi
complete || { say "build produced no llama_cpp package"; exit 1; }
say "built: $DEST/site"
echo "$DEST/site"
