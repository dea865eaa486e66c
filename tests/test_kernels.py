"""Batch-invariant quantized matmul on repacked weights (patches/llama-cpp-batch-invariant.patch, docs/kernels.md).

* Real models: logits of every position are bitwise equal whether the position is decoded
  alone or inside a batch of n tokens, for odd and large n (test_llama_cpp.py covers 2, 4, 8, 16),
  on every bundled model and so on every weight type they hold (Q4_1, Q8_0 for SmolLM2; Q4_K,
  Q5_0, Q6_K, Q8_0 for Gemma 3; Q4_K, Q6_K for Qwen2.5-Coder-1.5B; Q5_0, Q8_0, Q4_K, Q6_K for
  the 0.5B).
* Kernels: tests/native/test_batch_invariant_mm.c checks every type's kernels against the scalar
  canonical order bit for bit (n = 1..17, 31..33, 64; strided activations and outputs; nothing
  written outside), the repacked layout against the original (every row unpacks to its bytes),
  the vectorized Q8_K quantizer against ggml's, and ggml_mul_mat / ggml_get_rows through the
  CPU_BIMM buffer type over n tokens against one token at a time. The kernel source is built for
  every instruction-set family the CPU can run (AVX-512 with and without VNNI, AVX2, scalar), and
  each build is shown to fail under deliberate mutations: float operations reordered, a wrong
  scale, an error only in batches, a broken unpack.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from speculative.kernels import (
    BIMM_TYPES,
    cpu_info,
    kernel_info,
    llama_lib_dir,
    parse_system_info,
    patched_source_dir,
)
from speculative.models import REGISTRY
from speculative.numerics import check_batch_invariance

from conftest import ROOT

ODD_AND_LARGE = (3, 7, 13, 32, 64)


def test_parse_system_info():
    k = parse_system_info("CPU : SSE3 = 1 | AVX2 = 1 | BATCH_INVARIANT_MM = 1 | OPENMP = 1 | REPACK = 1 |")
    assert k.batch_invariant_mm and k.avx2 and not k.llamafile and not k.avx512 and not k.vnni
    assert all(t in k.summary for t in BIMM_TYPES)
    assert "256-bit" in k.summary and "vpmaddubsw" in k.summary and "512-bit" not in k.summary
    k = parse_system_info("CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | BATCH_INVARIANT_MM = 1 |")
    assert k.avx512 and k.vnni and "512-bit" in k.summary and "vpdpbusd" in k.summary
    k = parse_system_info("CPU : SSE3 = 1 | AVX2 = 1 | LLAMAFILE = 1 |")
    assert not k.batch_invariant_mm and k.llamafile and "per-pair vec_dot" in k.summary


@pytest.mark.parametrize("fixture", ["smol", "gemma"])
def test_logits_bitwise_equal_for_odd_and_large_batches(request, fixture):
    backend = request.getfixturevalue(fixture)
    rep = check_batch_invariance(backend, batch_sizes=ODD_AND_LARGE)
    assert rep.identical, f"{backend.model_id}: max difference {rep.max_abs_diff}"


@pytest.mark.parametrize("fixture", ["smol", "gemma"])
def test_logits_bitwise_equal_across_kv_padding(request, fixture):
    """Exact numerics pad the K/V cells attention reads to a multiple of 64: after 100 tokens, single
    steps read 128 cells up to position 127 and 192 after, a batch of 64 reads 192 throughout; the masked
    cells must add exact zeros (docs/kernels.md)."""
    from speculative.backends.llama_cpp import EXACT_KV_PAD

    backend = request.getfixturevalue(fixture)
    assert EXACT_KV_PAD == 64
    rep = check_batch_invariance(backend, batch_sizes=(5, 29, 64), context=100)
    assert rep.identical, f"{backend.model_id}: max difference {rep.max_abs_diff}"


def test_kv_padding_below_the_vector_step_is_caught(monkeypatch):
    """The check above can fail: padded to 32 cells, on AVX-512 (whose F16 dot product steps by 64) a cell's
    product moves between the vector loop and the scalar tail as n_kv changes, and batched logits differ."""
    if not kernel_info().avx512:
        pytest.skip("the F16 dot product steps by 32 without AVX-512: a padding of 32 is still exact there")
    from speculative.backends import llama_cpp as lc
    from speculative.backends import load_backend

    monkeypatch.setattr(lc, "EXACT_KV_PAD", 32)
    b = load_backend("smollm2-135m-instruct", n_ctx=4096)
    try:
        rep = check_batch_invariance(b, batch_sizes=(5, 29, 64), context=100)
    finally:
        b.close()
    assert not rep.identical


def test_exact_contexts_are_made_with_the_small_kv_padding(monkeypatch):
    import os

    from speculative.backends import llama_cpp as lc

    monkeypatch.setenv("LLAMA_KV_N_PAD_MIN", "256")
    with lc._context_mode(True):
        assert os.environ["LLAMA_KV_N_PAD_MIN"] == str(lc.EXACT_KV_PAD)
    assert os.environ["LLAMA_KV_N_PAD_MIN"] == "256"
    with lc._context_mode(False):
        assert os.environ["LLAMA_KV_N_PAD_MIN"] == "256"  # fast numerics: llama.cpp's own padding
    monkeypatch.delenv("LLAMA_KV_N_PAD_MIN")
    with lc._context_mode(True):
        pass
    assert "LLAMA_KV_N_PAD_MIN" not in os.environ


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


#: instruction-set families of the kernel source: (name, compiler flags, cpuinfo flags it needs, the
#: family ggml_bimm_isa() reports)
FAMILIES = (
    ("native", ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"], (), None),
    ("avx512bw", ["-march=native", "-mno-avx512vnni", "-mno-avxvnni", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"],
     ("avx512f", "avx512bw"), "AVX512BW"),
    ("avx2", ["-march=x86-64-v3", "-mno-avxvnni"], ("avx2", "fma", "f16c"), "AVX2"),
    ("scalar", ["-march=x86-64-v2"], (), "none"),
)

#: deliberate mutations of bimm.c (text replaced) that the harness must catch
MUTATIONS = {
    # the two float updates of a Q4_K block in the other order (the canonical order changes)
    "q4_K float order": ("""const vf f = FFMA(FMUL(d, FSET1(da)), FCVT(isum[t]), FLOAD(fb[t]));
                FSTORE(fb[t], FFNMA(FMUL(dmin, FSET1(da)), FCVT(msum), f));""",
                         """const vf f = FFNMA(FMUL(dmin, FSET1(da)), FCVT(msum), FLOAD(fb[t]));
                FSTORE(fb[t], FFMA(FMUL(d, FSET1(da)), FCVT(isum[t]), f));"""),
    # a Q6_K sub-block multiplied by another sub-block's scale
    "q6_K wrong scale": ("const vi sc = VSRA32(VSLL32(pl, 24 - 8 * k), 24);",
                         "const vi sc = VSRA32(VSLL32(pl, 24 - 8 * (3 - k)), 24);"),
    # an error only in tiles of more than 4 tokens
    "q8_0 batch-dependent": ("const vi  is = Q8_0_FIX(dot[t], ex[t][b]);",
                             "const vi  is = VADD(Q8_0_FIX(dot[t], ex[t][b]), VSET1(T > 2));"),
    # a repacked Q4_1 row unpacks with its scale as its minimum
    "q4_1 unpack": ("x->m = get_fp16(g + 32, r);", "x->m = get_fp16(g, r);"),
}


def _harness(tmp_path, family: str, flags: list[str], mutation: str | None = None, graph: bool = False):
    """Build tests/native/test_batch_invariant_mm.c with bimm.c compiled for ``flags`` (mutated if asked)
    against the installed libraries; run it. Returns the completed process."""
    src = patched_source_dir()
    cc = shutil.which("cc") or shutil.which("gcc")
    kernel = (src / "src" / "ggml-cpu" / "bimm.c").read_text()
    if mutation is not None:
        old, new = MUTATIONS[mutation]
        assert kernel.count(old) == 1, f"mutation {mutation!r} no longer applies to bimm.c"
        kernel = kernel.replace(old, new)
    copy = tmp_path / f"bimm-{family}.c"
    copy.write_text(kernel)
    obj = tmp_path / f"bimm-{family}.o"
    inc = [f"-I{src / 'include'}", f"-I{src / 'src'}", f"-I{src / 'src' / 'ggml-cpu'}"]
    out = subprocess.run([cc, "-O2", "-std=gnu11", *flags, *inc, "-c", str(copy), "-o", str(obj)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lib = llama_lib_dir()
    exe = tmp_path / f"test-{family}"
    harness = ROOT / "tests" / "native" / "test_batch_invariant_mm.c"
    out = subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{src / 'include'}", str(harness),
                          str(obj), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lggml-cpu", "-lggml-base", "-lggml", "-lm",
                          "-lpthread", "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return subprocess.run([str(exe)] + (["--graph"] if graph else []), capture_output=True, text=True, timeout=600)


def _need_harness():
    if not kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")
    if (shutil.which("cc") or shutil.which("gcc")) is None:
        pytest.skip("needs a C compiler")
    src = patched_source_dir()
    if not (src / "src" / "ggml-cpu" / "bimm.c").is_file():
        pytest.skip(f"needs the patched ggml source kept by scripts/setup.sh at {src}")


def _runnable(needs: tuple[str, ...]) -> bool:
    return all(f in cpu_info().flags for f in needs)


@pytest.mark.parametrize("family", [f[0] for f in FAMILIES])
def test_native_kernels_bit_for_bit(tmp_path, family):
    """Every instruction-set family this CPU runs: every type's kernels against the canonical order, the
    layouts, the quantizer; with the native build also mul_mat and get_rows through CPU_BIMM."""
    _need_harness()
    name, flags, needs, isa = next(f for f in FAMILIES if f[0] == family)
    if not _runnable(needs):
        pytest.skip(f"this CPU cannot run the {family} build")
    run = _harness(tmp_path, name, flags, graph=family == "native")
    assert run.returncode == 0 and run.stdout.rstrip().endswith("OK"), run.stdout + run.stderr
    reported = run.stdout.split("kernels: ")[-1].split()[0]
    assert isa is None or reported == isa, run.stdout
    has_kernels = reported != "none"
    for t in BIMM_TYPES:
        for k in (256, 1536):
            line = next(x for x in run.stdout.lower().splitlines() if x.startswith(f"{t.lower():5s} k={k} "))
            assert (" kernels: yes " in line) == has_kernels, line
            assert "kernel mismatches: 0 of" in line and "writes outside: 0" in line and "unpack mismatches: 0" in line
            if has_kernels:
                assert "of 0," not in line, line  # the kernels really ran
    assert "q8_K quantizer mismatches: 0 of 1000" in run.stdout
    if family == "native":
        for t in BIMM_TYPES:
            name = t[0].lower() + t[1:]  # ggml's type name
            assert f"{name:5s} CPU_BIMM get_rows mismatches: 0" in run.stdout
            assert run.stdout.count(f"{name:5s} CPU_BIMM mul_mat") == 3
        assert "column mismatches: 0, reference mismatches: 0" in run.stdout
        assert "q5_K  CPU      mul_mat n=9  column mismatches: 0" in run.stdout
        assert "f16   CPU      mul_mat n=9  column mismatches: 0" in run.stdout
        assert "f16 columns kernel mismatches against vec_dot_f16: 0 of " in run.stdout


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_native_harness_catches_mutations(tmp_path, mutation):
    """Each deliberate mutation fails the harness in every family that it reaches (the unpack mutation in
    every family, the kernel mutations in every family with kernels)."""
    _need_harness()
    tried = 0
    for name, flags, needs, isa in FAMILIES:
        if not _runnable(needs):
            continue
        if mutation != "q4_1 unpack" and isa == "none":
            continue  # no kernels in the scalar build
        run = _harness(tmp_path, name, flags, mutation=mutation)
        tried += 1
        assert run.returncode == 1 and run.stdout.rstrip().endswith("FAILED"), f"{name}: {run.stdout}"
    assert tried >= 2


@pytest.mark.quick
@pytest.mark.parametrize("value", ["7", "0", "garbage", "", "-64"])
def test_a_kv_padding_llama_cpp_would_ignore_is_refused_in_fast_numerics(monkeypatch, value):
    from speculative.backends import load_backend
    from speculative.errors import ConfigError

    monkeypatch.setenv("LLAMA_KV_N_PAD_MIN", value)
    with pytest.raises(ConfigError, match="must be a power of two"):
        load_backend("smollm2-135m-instruct", numerics="fast")
    monkeypatch.setenv("LLAMA_KV_N_PAD_MIN", "32")  # a power of two is llama.cpp's to use
    load_backend("smollm2-135m-instruct", numerics="fast", n_ctx=256).close()
