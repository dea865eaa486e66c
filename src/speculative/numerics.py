"""Is a position's logits independent of how many tokens share its forward pass?

Greedy speculative decoding reproduces plain greedy decoding token for token
only if verifying a block of k+1 tokens yields, at each position, exactly the
logits a one-token step would. llama.cpp's default CPU kernels break this
(llamafile sgemm, repacked and tiled K-quant matmuls, flash attention); see
:mod:`speculative.backends.llama_cpp`. This module measures it on the loaded
model, once per (llama.cpp build, model file), and caches the verdict.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .backends.base import Backend, ForwardRequest
from .cache import cache_dir, file_key, read_json, write_json_atomic

_PROBE_TEXT = (
    "Speculative decoding drafts several tokens and verifies them in one forward pass of the target model, "
    "so the output distribution is exactly the target's."
)

FIX_HINT = (
    "rebuild llama-cpp-python without llamafile: "
    'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --force-reinstall --no-cache-dir '
    "--no-binary llama-cpp-python llama-cpp-python (the README's set-up does this)"
)


@dataclass
class NumericsReport:
    """Result of :func:`check_batch_invariance`.

    Attributes:
        identical: every position's logits were bitwise equal alone and batched.
        max_abs_diff: largest absolute logit difference seen.
        batch_sizes: batch sizes compared against one-token steps.
    """

    identical: bool
    max_abs_diff: float
    batch_sizes: list[int]


#: batch sizes ``speculative doctor`` checks: every verification size up to 16, odd ones, server batches
FULL_BATCH_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 32, 64)


def check_batch_invariance(backend: Backend, batch_sizes: tuple[int, ...] = (4, 16), context: int = 4) -> NumericsReport:
    """Compare one-token steps with batched steps on ``backend``'s sequence 0 (left empty afterwards),
    after ``context`` tokens. The singles and the batches see different numbers of K/V cells where the
    block crosses a multiple of the cache padding (64 in exact numerics): that is checked too."""
    ids = backend.encode(_PROBE_TEXT)
    n = max(batch_sizes)
    while len(ids) < n + context:
        ids = ids + ids
    prefix, block = ids[:context], ids[context : context + n]
    seq = 0
    backend.truncate(seq, 0)
    try:
        backend.forward([ForwardRequest(seq, prefix, logits="none")])
        singles = np.stack(
            [backend.forward([ForwardRequest(seq, [t], logits="all")])[0].logits[0].copy() for t in block]
        )
        worst = 0.0
        for bs in batch_sizes:
            backend.truncate(seq, len(prefix))
            out = backend.forward([ForwardRequest(seq, block[:bs], logits="all")])[0].logits
            worst = max(worst, float(np.max(np.abs(out - singles[:bs]))))
    finally:
        backend.truncate(seq, 0)
    return NumericsReport(worst == 0.0, worst, list(batch_sizes))


def _build_key() -> str:
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    parts = [getattr(llama_cpp, "__version__", "?")]
    for so in sorted(lib.glob("*.so*")) if lib.is_dir() else []:
        parts.append(file_key(so))
    return "-".join(parts)


def cached_batch_invariance(backend, batch_sizes: tuple[int, ...] = (4, 16)) -> NumericsReport:
    """:func:`check_batch_invariance` for a llama.cpp backend, cached per build, model file and batch sizes."""
    path = cache_dir("numerics") / "llama_cpp.json"
    key = f"{_build_key()}|{file_key(backend.path)}|{backend.numerics}"
    if backend.numerics == "exact":
        from .backends.llama_cpp import EXACT_KV_PAD

        key += f"|kvpad{EXACT_KV_PAD}"  # the padding decides which cells' sums change with n_kv
    batch_sizes = tuple(batch_sizes)
    if batch_sizes != (4, 16):
        key += "|" + ",".join(map(str, batch_sizes))
    data = read_json(path)
    if key in data:
        return NumericsReport(**data[key])
    n = max(batch_sizes)
    if backend.n_ctx < n + 4 or getattr(backend, "_batch_cap", 16) < n:
        # too small a window for the check (n tokens after 4): run it on a probe context of the same model
        probe = type(backend)(backend.path, n_ctx=max(64, n + 8), n_threads=backend.n_threads, numerics=backend.numerics)
        try:
            report = check_batch_invariance(probe, batch_sizes)
        finally:
            probe.close()
    else:
        report = check_batch_invariance(backend, batch_sizes)
    data[key] = asdict(report)
    write_json_atomic(path, data)
    return report


def ensure_batch_invariance(backend) -> NumericsReport:
    """Check once (cached), set ``backend.batch_invariant``, and warn on stderr when logits differ."""
    report = cached_batch_invariance(backend)
    backend.batch_invariant = report.identical
    if not report.identical:
        print(
            f"[speculative] WARNING: this llama.cpp build computes batched logits differently from "
            f"single-token logits (max difference {report.max_abs_diff:.3g} on {backend.model_id}); "
            f"greedy speculative output may differ from plain decoding. Fix: {FIX_HINT}. "
            f"Run `speculative doctor` for details.",
            file=sys.stderr,
        )
    return report
