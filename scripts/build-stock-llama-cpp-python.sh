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
# advertises AMX, AMX is left out (its tile instructions fault on some virtual machines, and the
# server would die with SIGILL); build-info.txt then says so, and SPECULATIVE_LLAMA_AMX=1 keeps it.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

say() { printf '[stock-llama-cpp-python] %s\n' "$*" >&2; }

VERSION=$(sed -n 's/^LLAMA_CPP_VERSION=//p' scripts/setup.sh)
[ -n "$VERSION" ] || { say "cannot read LLAMA_CPP_VERSION from scripts/setup.sh"; exit 2; }
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
sha() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi; }
# the key: the CPU's flags and this script (a changed recipe is a new build)
cpu_key=$( { (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -a); cat "$SELF"; } | sha | cut -c1-12)
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
PIP_PID=""
# pip runs in a session of its own (setsid, where there is one): an interrupt ends its whole tree, the
# compilers included
cleanup() { [ -z "$PIP_PID" ] || kill -- "-$PIP_PID" 2>/dev/null || kill "$PIP_PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'say "interrupted; nothing cached"; exit 130' INT TERM

SETSID=""
command -v setsid >/dev/null && SETSID=setsid
EXTRA=()
if [ -n "$amx_tag" ]; then
    say "building without llama.cpp's AMX kernels (SPECULATIVE_LLAMA_AMX=1 keeps them)"
    EXTRA=(env CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'")
fi
say "building llama-cpp-python $VERSION from its sdist with its default options (about 5 minutes on 2 idle cores)"
# Build settings from the caller's environment would change the build: drop them (CMake's and
# scikit-build-core's, the compilers' flags, SOURCE_DATE_EPOCH, which turns GGML_NATIVE off, and pip's
# own configuration: --isolated). --no-cache-dir: pip's wheel cache does not key on build flags and
# may hold our patched wheel's twin. pip runs in the background so that an interrupt reaches the trap
# at once, which ends it.
env -u CMAKE_ARGS -u FORCE_CMAKE -u SKBUILD_CMAKE_ARGS -u SKBUILD_CMAKE_DEFINE -u CMAKE_BUILD_TYPE \
    -u CMAKE_GENERATOR -u CFLAGS -u CXXFLAGS -u CPPFLAGS -u LDFLAGS -u CC -u CXX -u SOURCE_DATE_EPOCH \
    "${EXTRA[@]}" $SETSID "$PY" -m pip --isolated install -q --no-cache-dir --no-binary llama-cpp-python \
    --target "$WORK/out/site" "llama-cpp-python==$VERSION" >"$WORK/build.log" 2>&1 &
PIP_PID=$!
status=0
wait "$PIP_PID" || status=$?
PIP_PID=""
[ "$status" = 0 ] || { tail -20 "$WORK/build.log" >&2; say "build failed"; exit 1; }
{
    echo "llama-cpp-python $VERSION, pip install --no-binary llama-cpp-python with no CMAKE_ARGS (default build)${amx_tag:+, AMX left out}"
    echo "python $PYVER ($("$PY" -c 'import sys; print(sys.base_prefix)'))"
} >"$WORK/out/build-info.txt"
# publish by a rename (atomic); another process may have finished first: keep its copy. A leftover
# incomplete folder is replaced. (A plain mv: GNU mv -T is not on macOS.)
if [ -e "$DEST" ] && ! complete; then rm -rf "$DEST"; fi
[ -e "$DEST" ] || mv "$WORK/out" "$DEST"
complete || { say "build produced no llama_cpp package"; exit 1; }
say "built: $DEST/site"
echo "$DEST/site"
