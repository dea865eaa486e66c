"""Batch-invariant quantized matmul (patches/llama-cpp-batch-invariant.patch, docs/kernels.md).

* Real models: logits of every position are bitwise equal whether the position is decoded
  alone or inside a batch of n tokens, for odd and large n (test_llama_cpp.py covers 2, 4, 8, 16),
  on every bundled model and so on every weight type they hold (Q4_1, Q8_0 for SmolLM2; Q4_K,
  Q5_0, Q6_K, Q8_0 for Gemma 3; Q4_K, Q6_K for Qwen2.5-Coder-1.5B).
* Kernels: tests/native/test_batch_invariant_mm.c checks every multi-token kernel against ggml's
  vec_dot bit for bit (n = 1..17, 31..33, 64; strided inputs and outputs) and ggml_mul_mat over n
  tokens against one token at a time, compiled against the installed build's shared libraries.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from speculative.kernels import (
    MULTI_ROW_TYPES_AVX2,
    MULTI_TOKEN_TYPES,
    kernel_info,
    llama_lib_dir,
    parse_system_info,
    patched_include_dir,
)
from speculative.models import REGISTRY
from speculative.numerics import check_batch_invariance

from conftest import ROOT

ODD_AND_LARGE = (3, 7, 13, 32, 64)


def test_parse_system_info():
    k = parse_system_info("CPU : SSE3 = 1 | AVX2 = 1 | BATCH_INVARIANT_MM = 1 | OPENMP = 1 | REPACK = 1 |")
    assert k.batch_invariant_mm and k.avx2 and not k.llamafile and not k.avx512
    assert all(t in k.summary for t in MULTI_TOKEN_TYPES)
    assert "256-bit multi-row tiles: Q4_K, Q6_K" in k.summary and "512-bit" not in k.summary
    k = parse_system_info("CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | BATCH_INVARIANT_MM = 1 |")
    assert k.avx512 and "512-bit multi-row tiles" in k.summary
    k = parse_system_info("CPU : SSE3 = 1 | AVX2 = 1 | LLAMAFILE = 1 |")
    assert not k.batch_invariant_mm and k.llamafile and "per-pair vec_dot" in k.summary


@pytest.mark.parametrize("fixture", ["smol", "gemma"])
def test_logits_bitwise_equal_for_odd_and_large_batches(request, fixture):
    backend = request.getfixturevalue(fixture)
    rep = check_batch_invariance(backend, batch_sizes=ODD_AND_LARGE)
    assert rep.identical, f"{backend.model_id}: max difference {rep.max_abs_diff}"


@pytest.mark.qwen
def test_logits_bitwise_equal_qwen_target():
    name = "qwen2.5-coder-1.5b-instruct"
    if name not in REGISTRY:
        pytest.skip(f"{name} is not registered")
    from speculative.backends import load_backend

    b = load_backend(name, n_ctx=256)
    try:
        rep = check_batch_invariance(b, batch_sizes=(3, 8, 13))
    finally:
        b.close()
    assert rep.identical, f"max difference {rep.max_abs_diff}"


def test_native_kernels_bit_for_bit(tmp_path):
    """The C harness against the installed llama.cpp build (skipped only without the patched build or a C compiler)."""
    if not kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")
    cc = shutil.which("cc") or shutil.which("gcc")
    include = patched_include_dir()
    if cc is None or not (include / "ggml-cpu.h").is_file():
        pytest.skip(f"needs a C compiler and the patched ggml headers at {include} (kept by scripts/setup.sh)")
    lib = llama_lib_dir()
    exe = tmp_path / "test_batch_invariant_mm"
    src = ROOT / "tests" / "native" / "test_batch_invariant_mm.c"
    build = subprocess.run(
        [cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{include}", str(src), f"-L{lib}",
         f"-Wl,-rpath,{lib}", "-lggml-cpu", "-lggml-base", "-lm", "-o", str(exe)],
        capture_output=True, text=True, timeout=120,
    )
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("(5 multi-token kernels)"), run.stdout + run.stderr
    assert "batch_invariant_mm=1" in run.stdout
    for t in MULTI_TOKEN_TYPES:  # every kernel ran and matched
        line = f"{t.lower():5s} multi-token kernel: yes  kernel mismatches: 0, mul_mat column mismatches: 0"
        assert line in run.stdout.lower(), run.stdout
    # the multi-row tiles (every multi-token type with AVX-512BW/VL, the K-quants with AVX2 only): ran and matched
    row_types = MULTI_TOKEN_TYPES if kernel_info().avx512 else MULTI_ROW_TYPES_AVX2
    assert f"multi-row kernels: {len(row_types)}" in run.stdout, run.stdout
    for t in row_types:
        assert f"{t.lower():5s} multi-row kernel: yes  kernel mismatches: 0" in run.stdout.lower(), run.stdout
