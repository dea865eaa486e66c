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
  every instruction-set family the CPU can run (AVX-512 with and without VNNI, AVX2 with and without
  AVX-VNNI, scalar), and each build is shown to fail under deliberate mutations: float operations
  reordered, a wrong scale (in the VNNI and in the other builds' Q4_K sub-block products), an error
  only in batches, a broken unpack.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from speculative.kernels import (
    BIMM_TYPES,
    bimm_isa,
    cpu_info,
    has_batch_invariant_attention,
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
    """The check above can fail: padded to 4 cells, on AVX-512 (whose softmax steps by 16 floats) a cell
    moves between the softmax's vector loop and its scalar tail as n_kv changes, and batched logits
    differ. (The caches' dot products, ggml_bimm_f16_dot, are exact for any padding: masked cells add
    zeros at the end of their lanes.)"""
    if not kernel_info().avx512:
        pytest.skip("measured on AVX-512 (a padding of 4 fails there); AVX2's softmax steps by 8")
    from speculative.backends import llama_cpp as lc
    from speculative.backends import load_backend

    monkeypatch.setattr(lc, "EXACT_KV_PAD", 4)
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


def test_exact_contexts_flag_their_caches_batch_invariant(monkeypatch):
    """Exact contexts are made with LLAMA_KV_BATCH_INVARIANT=1 (fast ones with 0, whatever the user set), and
    the flag takes effect: the same exact model with unflagged caches (llama.cpp's vec_dot_f16 order in
    attention) gives other logits."""
    import os

    import numpy as np

    from speculative.backends import llama_cpp as lc
    from speculative.backends import load_backend
    from speculative.request import ForwardRequest

    monkeypatch.setenv("LLAMA_KV_BATCH_INVARIANT", "1")
    with lc._context_mode(True):
        assert os.environ["LLAMA_KV_BATCH_INVARIANT"] == "1"
    with lc._context_mode(False):
        assert os.environ["LLAMA_KV_BATCH_INVARIANT"] == "0"
    assert os.environ["LLAMA_KV_BATCH_INVARIANT"] == "1"
    monkeypatch.delenv("LLAMA_KV_BATCH_INVARIANT")
    if not kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")
    assert has_batch_invariant_attention()  # the symbol doctor's "attention" line checks

    def logits():
        b = load_backend("smollm2-135m-instruct", n_ctx=512, check_numerics=False)
        try:
            toks = b.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)")
            return np.array(b.forward([ForwardRequest(0, toks, logits="all")])[0].logits, copy=True)
        finally:
            b.close()

    flagged = logits()
    unflagged_mode = lc._context_mode
    monkeypatch.setattr(lc, "_context_mode", lambda exact: lc._env_during(
        {"LLAMA_KV_N_PAD_MIN": str(lc.EXACT_KV_PAD), "LLAMA_KV_BATCH_INVARIANT": "0"}))
    unflagged = logits()
    monkeypatch.setattr(lc, "_context_mode", unflagged_mode)
    assert flagged.shape == unflagged.shape
    assert not np.array_equal(flagged, unflagged)
    assert np.array_equal(flagged, logits())  # and exact numerics are deterministic


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
    # the native build with a VNNI sub-block's two halves packed into one vpdpwssd in tiles of 3 tokens or more
    # (GGML_BIMM_PAIRS, the default where the compiler targets AMD Zen), and without (the default elsewhere)
    ("native-pairs", ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-DGGML_BIMM_PAIRS=1"], (), None),
    ("native-no-pairs", ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-DGGML_BIMM_PAIRS=0"], (),
     None),
    ("avx512bw", ["-march=native", "-mno-avx512vnni", "-mno-avxvnni", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"],
     ("avx512f", "avx512bw"), "AVX512BW"),
    ("avx2-vnni", ["-march=x86-64-v3", "-mavxvnni"], ("avx2", "fma", "f16c", "avx_vnni"), "AVX2-VNNI"),
    ("avx2", ["-march=x86-64-v3", "-mno-avxvnni"], ("avx2", "fma", "f16c"), "AVX2"),
    ("scalar", ["-march=x86-64-v2"], (), "none"),
)

#: deliberate mutations of the kernel sources (file, text replaced, replacement, the instruction-set
#: families whose code it changes: "kernels" = every family with SIMD kernels, "VNNI" / "no VNNI" = the
#: families with kernels whose ISA name has / lacks VNNI, "pairs" = the native-pairs family where its ISA
#: has VNNI) that the harness must catch
MUTATIONS = {
    # the two float updates of a Q4_K block in the other order (the canonical order changes)
    "q4_K float order": ("bimm.c", """const vf f = FFMA(FMUL(d, FSET1(da)), FCVT(isum[t]), FLOAD(fb[t]));
                FSTORE(fb[t], FFNMA(FMUL(dmin, FSET1(da)), FCVT(msum), f));""",
                         """const vf f = FFNMA(FMUL(dmin, FSET1(da)), FCVT(msum), FLOAD(fb[t]));
                FSTORE(fb[t], FFMA(FMUL(d, FSET1(da)), FCVT(isum[t]), f));""", "kernels"),
    # with VNNI: a Q4_K sub-block's second 16-weight product multiplied by a scale one too large
    "q4_K half-product scale (VNNI)": ("bimm.c", "isum[t] = VDPWSSD(VDPWSSD(isum[t], d0[t], sc), d1[t], sc);",
                                       "isum[t] = VDPWSSD(VDPWSSD(isum[t], d0[t], sc), d1[t], VADD(sc, VSET1(1)));",
                                       "VNNI"),
    # with VNNI, tiles of 3 tokens or more: a Q4_K sub-block's first 16-weight product in both words of the pair
    # (the second one dropped)
    "q4_K packed halves": ("bimm.c", "VPACK16(d0[t], d1[t])", "VPACK16(d0[t], d0[t])", "pairs"),
    # the same for a Q6_K sub-block's two 8-weight halves
    "q6_K packed halves": ("bimm.c", "VPACK16(dot[0], dot[1])", "VPACK16(dot[0], dot[0])", "pairs"),
    # the scale in the pair's low word only (the second half's product dropped)
    "q4_K pair scale (packed)": ("bimm.c", "const vi sc2 = VPACK16(sc, sc);", "const vi sc2 = sc;", "pairs"),
    # without VNNI: a Q4_K sub-block's scale in the pair product's low half only (its odd pairs dropped)
    "q4_K pair scale (no VNNI)": ("bimm.c", "const vi sc2 = VOR(sc, VSLL32(sc, 16));", "const vi sc2 = sc;", "no VNNI"),
    # without VNNI: a Q4_K sub-block's 16-bit pair sums taking each vector's products from its neighbour's
    # activations (every vector's weights against the wrong four bytes)
    "q4_K 16-bit sums (no VNNI)": ("bimm.c", "s16[t] = VADD16(s16[t], VMADDUBS(u, VBCAST(a[t] + 4 * m)));",
                                   "s16[t] = VADD16(s16[t], VMADDUBS(u, VBCAST(a[t] + 4 * (m ^ 1))));", "no VNNI"),
    # a Q6_K sub-block multiplied by another sub-block's scale
    "q6_K wrong scale": ("bimm.c", "isum[t] = DPWSSD(isum[t], dot, scs[k]);",
                         "isum[t] = DPWSSD(isum[t], dot, scs[3 - k]);", "kernels"),
    # a negative Q6_K scale sign-extended into its lane's high word, which then multiplies the high word (the
    # sign) of a negative half-sub-block product
    "q6_K scale high word": ("bimm.c", "const vi scs[4] = { VAND(se, m16), VAND(so, m16), VSRL32(se, 16), VSRL32(so, 16) };",
                             "const vi scs[4] = { VSRA32(VSLL32(se, 16), 16), VAND(so, m16), VSRL32(se, 16), VSRL32(so, 16) };",
                             "kernels"),
    # a Q6_K half sub-block's -32 offset taken from the next sub-block's activations (another scale multiplies it)
    "q6_K offset": ("bimm.c", "vi dot = VBCAST(off[t] + 2 * s + i);", "vi dot = VBCAST(off[t] + (2 * s + i + 2) % 32);",
                    "kernels"),
    # an error only in tiles of more than 4 tokens
    "q8_0 batch-dependent": ("bimm.c", "const vi  is = Q8_0_FIX(dot[t], ex[t][b]);",
                             "const vi  is = VADD(Q8_0_FIX(dot[t], ex[t][b]), VSET1(T > 2));", "kernels"),
    # a repacked Q4_1 row unpacks with its scale as its minimum
    "q4_1 unpack": ("bimm.c", "x->m = get_fp16(g + 32, r);", "x->m = get_fp16(g, r);", "all"),
    # attention's F16 dot products: a partial block's lanes added in another tree, (l, l+4) before (l, l+8)
    # (the same 16 partial sums, other roundings)
    "f16 tree order (AVX-512)": (
        "bimm-f16.c",
        """    __m512 t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xEE));  // lanes 0-7: l + (l+8)
    t        = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0x01));  // lanes 0-3: l + (l+4)""",
        """    __m512 t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
    t        = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0x02));""", "AVX512"),
    # the same with AVX2: neighbouring lanes added first
    "f16 tree order (AVX2)": (
        "bimm-f16.c",
        "const __m256 t = _mm256_add_ps(lo, hi);",
        "const __m256 t = _mm256_hadd_ps(lo, hi);", "AVX2"),
    # a full 4 x 4 block's outputs reduced into the wrong places
    "f16 block scatter": (
        "bimm-f16.c",
        "_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));",
        "_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 0)));", "AVX512"),
    # a block of fewer than 4 rows storing a whole quarter per column (rows of the next block or past the end)
    "f16 partial block's store": (
        "bimm-f16.c",
        "_mm_mask_storeu_ps(dst[4 * g + j], (__mmask8) ((1u << nr) - 1), q);",
        "_mm_storeu_ps(dst[4 * g + j], q);", "AVX512"),
    # every column block of a call writing its outputs to the call's first columns
    "f16 column blocks": ("bimm-f16.c", "dc[c] = dst[c0 + c] + r0;", "dc[c] = dst[c] + r0;", "kernels"),
    # the per-thread column buffer no longer handed to the key that frees it when its thread exits
    "f16 buffer leak": (
        "bimm-f16.c",
        "GGML_ASSERT(pthread_setspecific(ybuf_key, ybuf) == 0);",
        "(void) ybuf_key;", "kernels"),
}

#: the kernel sources the harness compiles for each family
KERNEL_SOURCES = ("bimm.c", "bimm-f16.c")


def _harness(tmp_path, family: str, flags: list[str], mutation: str | None = None, graph: bool = False):
    """Build tests/native/test_batch_invariant_mm.c with bimm.c and bimm-f16.c compiled for ``flags`` (one
    of them mutated if asked) against the installed libraries; run it. Returns the completed process."""
    src = patched_source_dir()
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = [f"-I{src / 'include'}", f"-I{src / 'src'}", f"-I{src / 'src' / 'ggml-cpu'}"]
    objs = []
    for name in KERNEL_SOURCES:
        kernel = (src / "src" / "ggml-cpu" / name).read_text()
        if mutation is not None and MUTATIONS[mutation][0] == name:
            _, old, new, _ = MUTATIONS[mutation]
            assert kernel.count(old) == 1, f"mutation {mutation!r} no longer applies to {name}"
            kernel = kernel.replace(old, new)
        copy = tmp_path / f"{family}-{name}"
        copy.write_text(kernel)
        obj = copy.with_suffix(".o")
        out = subprocess.run([cc, "-O2", "-std=gnu11", *flags, *inc, "-c", str(copy), "-o", str(obj)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        objs.append(str(obj))
    lib = llama_lib_dir()
    exe = tmp_path / f"test-{family}"
    harness = ROOT / "tests" / "native" / "test_batch_invariant_mm.c"
    out = subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{src / 'include'}", str(harness),
                          *objs, f"-L{lib}", f"-Wl,-rpath,{lib}", "-lggml-cpu", "-lggml-base", "-lggml", "-lm",
                          "-lpthread", "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return subprocess.run([str(exe)] + (["--graph"] if graph else []), capture_output=True, text=True, timeout=600)


def _need_harness():
    if not kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")
    if (shutil.which("cc") or shutil.which("gcc")) is None:
        pytest.skip("needs a C compiler")
    src = patched_source_dir()
    if not all((src / "src" / "ggml-cpu" / name).is_file() for name in KERNEL_SOURCES):
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
    leak = next(x for x in run.stdout.splitlines() if x.startswith("f16 column buffers of ended threads"))
    assert not has_kernels or "not measured" in leak or int(leak.split(": ")[1].split()[0]) <= 4 << 20, leak
    f16 = next(x for x in run.stdout.splitlines() if x.startswith("f16 dot kernel mismatches"))
    assert f16.startswith("f16 dot kernel mismatches against the canonical order: 0 of ") and f16.endswith(
        "writes outside: 0") and " of 0," not in f16, f16
    if family == "native":
        for t in BIMM_TYPES:
            name = t[0].lower() + t[1:]  # ggml's type name
            assert f"{name:5s} CPU_BIMM get_rows mismatches: 0" in run.stdout
            assert run.stdout.count(f"{name:5s} CPU_BIMM mul_mat") == (4 if name in ("q8_0", "q4_K") else 3)
        mm = [x for x in run.stdout.splitlines() if " CPU_BIMM mul_mat " in x]
        assert mm and all("column mismatches: 0, reference mismatches: 0, rows: " in x for x in mm), mm
        # 37 row groups split unevenly between the 2 threads (bimm-buffer.cpp)
        assert "q8_0  CPU_BIMM mul_mat n=3  column mismatches: 0, reference mismatches: 0, rows: 592" in run.stdout
        # 3 threads: shares of activation rows and row groups of other sizes (bimm-buffer.cpp)
        assert "q4_K  CPU_BIMM mul_mat n=17 column mismatches: 0, reference mismatches: 0, rows: 64, threads: 3" in run.stdout
        # single-token rows split across threads (ops.cpp): (1000 + 8960) x (1 + 2 rows) x 2 forms x 2 thread counts
        assert "f32   swiglu of fewer rows than threads (2, 3 threads against 1) mismatches: 0 of 119520" in run.stdout
        # 640 cells x 3 tokens x 12 heads x 2 sequences x 3 thread counts
        assert ("f32   soft_max rows of tokens, heads and sequences (1-3 threads against each row alone) mismatches: "
                "0 of 138240") in run.stdout
        assert "q5_K  CPU      mul_mat n=9  column mismatches: 0" in run.stdout
        assert "f16   CPU      mul_mat n=9  column mismatches: 0" in run.stdout
        assert "f16 columns kernel mismatches against vec_dot_f16: 0 of " in run.stdout
        # attention's columns in one range per thread (ggml-cpu.c): uneven ranges, ranges crossing K/V heads, idle
        # threads, a column's rows split (more threads than columns)
        flagged = [x for x in run.stdout.splitlines() if x.startswith("f16   flagged  mul_mat ")]
        for k, n, nth in ((128, 9, 2), (100, 5, 2), (100, 5, 3), (128, 9, 4), (64, 1, 4), (64, 1, 13)):
            assert (f"f16   flagged  mul_mat k={k:<3d} n={n:<2d} threads={nth:<2d} column mismatches: 0, "
                    "reference mismatches: 0") in run.stdout, flagged
        writes = [x for x in run.stdout.splitlines() if x.startswith("f16   set_rows of one-element rows")]
        assert [x.split("mismatches: ")[1] for x in writes] == [
            "0, elements written: 6144", "0, elements written: 45"], writes  # 3 thread counts x 256 x 8, x 5 x 3
        assert "f32   soft_max rows with the maximum anywhere: 0 of 794 wrong" in run.stdout


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_native_harness_catches_mutations(tmp_path, mutation):
    """Each deliberate mutation fails the harness in every family that it reaches (the unpack mutation in
    every family, the weight kernels' mutations in every family with kernels, the F16 ones in the families
    whose code they change)."""
    _need_harness()
    reaches = MUTATIONS[mutation][3]
    tried = 0
    for name, flags, needs, isa in FAMILIES:
        if not _runnable(needs):
            continue
        reported = isa or bimm_isa() or "none"  # the native family: the installed build's
        if reaches == "kernels" and reported == "none":
            continue  # no kernels in the scalar build
        if reaches in ("AVX512", "AVX2") and not reported.startswith(reaches):
            continue
        if reaches == "VNNI" and "VNNI" not in reported:
            continue
        if reaches == "no VNNI" and ("VNNI" in reported or reported == "none"):
            continue
        if reaches == "pairs" and (name != "native-pairs" or "VNNI" not in reported):
            continue
        if name in ("native-pairs", "native-no-pairs") and reaches != "pairs":
            continue  # the native family already carries the other mutations' code
        run = _harness(tmp_path, name, flags, mutation=mutation)
        tried += 1
        assert run.returncode == 1 and run.stdout.rstrip().endswith("FAILED"), f"{name}: {run.stdout}"
    if tried == 0:
        pytest.skip(f"no instruction-set family this CPU runs has the code the mutation {mutation!r} changes")
    assert tried >= (2 if reaches in ("all", "kernels", "AVX512") else 1)


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


_HUGE_PAGES_PROBE = """
from speculative.backends import load_backend
b = load_backend("smollm2-135m-instruct", n_ctx=256, check_numerics=False)
print(next(l.split()[1] for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:")))
"""


def test_repacked_weights_ask_for_huge_pages():
    """On Linux the CPU_BIMM weight buffer is madvised MADV_HUGEPAGE (a single-token forward streams every weight
    once): with THP in "madvise" mode the weights get 2 MiB pages, and GGML_CPU_BIMM_HUGEPAGES=0 leaves them out."""
    import os
    import sys
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.is_file() or "[madvise]" not in thp.read_text():
        pytest.skip("transparent huge pages are not in 'madvise' mode here")
    if not kernel_info().batch_invariant_mm:
        pytest.skip("llama-cpp-python is not the batch-invariant build (scripts/setup.sh builds it)")

    def huge_kib(flag: str) -> int:
        env = {**os.environ, "GGML_CPU_BIMM_HUGEPAGES": flag}
        r = subprocess.run([sys.executable, "-c", _HUGE_PAGES_PROBE], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split()[-1])

    advised, left_alone = huge_kib("1"), huge_kib("0")
    assert advised >= left_alone + 32 * 1024, (advised, left_alone)  # KiB: at least 16 huge pages more
