"""``speculative profile``: the verification cost T(n) of a target against what bounds it on this machine.

T(n) is the wall time of one target forward over n tokens with logits at every
position, after ``context_tokens`` tokens of context (each timed forward is rolled
back). The sizes are timed in interleaved rounds: each round times every size
``repeats`` times (and, with the patched llama.cpp build, the memory read
bandwidth once), so slow drift of a shared machine spreads over all sizes alike.
A size's T(n) is the median over rounds of that round's median of ``repeats``
forwards; a ratio T(n)/T(1) is the median over rounds of the ratio within a round
(not a ratio of medians).

Beside T(n) the report gives what bounds it: the bytes of weights one forward
reads (the matrices the forward multiplies; a token embedding that is only looked
up is not read), the read bandwidth of the decoding threads
(:func:`~speculative.kernels.read_bandwidth`), hence the time to read the weights
once, which a single-token forward cannot beat, and the integer multiply-add peak
(:func:`~speculative.kernels.peak_macs`), which bounds forwards over many tokens.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .backends.base import Backend, ForwardRequest

#: version of the JSON written by ``speculative profile --json``
SCHEMA = 1


def matmul_weight_bytes(gguf_path: str | Path) -> int:
    """Bytes of the weights a forward of this GGUF model reads: every tensor but a token embedding that
    is only looked up (a model with its own ``output.weight``); a tied embedding is the output head and
    counts. Norm vectors count too (a few KB)."""
    from gguf import GGUFReader

    tensors = GGUFReader(str(gguf_path)).tensors
    names = {t.name for t in tensors}
    untied = "output.weight" in names
    return int(sum(int(t.n_bytes) for t in tensors if not (untied and t.name == "token_embd.weight")))


def profile_target(backend: Backend, sizes: Sequence[int], context_tokens: int = 600, repeats: int = 5,
                   rounds: int = 3, bandwidth: bool = True, peak: bool = True, progress=None) -> dict:
    """Measure T(n) for every n in ``sizes`` in ``rounds`` interleaved rounds (see the module docstring).

    Args:
        backend: the target (its sequence 0 is used and cleared at the end).
        sizes: forward sizes n (tokens), each >= 1.
        context_tokens: cached context before each timed forward.
        repeats: forwards per size and round.
        rounds: interleaved rounds.
        bandwidth: also measure the read bandwidth once per round (llama.cpp backend, patched build).
        peak: also measure the integer multiply-add peak once, at the end.
        progress: called with (round, rounds) after each round, or None.

    Returns:
        A JSON-able dict: ``t_ms`` (n -> T(n) in ms), ``ratio_to_t1`` (n -> median over rounds of
        T(n)/T(1)), every timing (``raw_ms[round][i][repeat]`` for ``sizes[i]``), the bandwidth of each
        round (bytes/s), ``weight_bytes``, ``weight_read_ms`` and ``t1_over_weight_read`` (llama.cpp),
        ``peak_macs`` (multiply-adds/s), the machine and the build.

    Raises:
        ValueError: an empty ``sizes``, a size < 1, or repeats/rounds < 1.
    """
    from . import kernels

    sizes = [int(n) for n in sizes]
    if not sizes or min(sizes) < 1 or repeats < 1 or rounds < 1:
        raise ValueError("sizes must be >= 1, repeats and rounds >= 1")
    rng = np.random.default_rng(0)
    hi = min(backend.vocab_size, 30000)
    ctx = rng.integers(100, hi, size=context_tokens).tolist()
    block = rng.integers(100, hi, size=max(sizes)).tolist()
    threads = getattr(backend, "n_threads", None)
    is_llama = backend.name == "llama.cpp"
    raw: list[list[list[float]]] = []
    bw: list[float] = []
    backend.truncate(0, 0)
    try:
        if ctx:
            backend.forward([ForwardRequest(0, ctx, logits="none")])
        backend.forward([ForwardRequest(0, block[:2], logits="all")])  # warm-up
        backend.truncate(0, context_tokens)
        for r in range(rounds):
            if bandwidth and is_llama and threads:
                value = kernels.read_bandwidth(threads, rounds=3)
                if value:
                    bw.append(value)
            this_round = []
            for n in sizes:
                ts = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    backend.forward([ForwardRequest(0, block[:n], logits="all")])
                    ts.append(1000.0 * (time.perf_counter() - t))
                    backend.truncate(0, context_tokens)
                this_round.append(ts)
            raw.append(this_round)
            if progress is not None:
                progress(r + 1, rounds)
    finally:
        backend.truncate(0, 0)
    round_medians = [[statistics.median(ts) for ts in rnd] for rnd in raw]
    t_ms = {n: statistics.median(rm[i] for rm in round_medians) for i, n in enumerate(sizes)}
    ratio = {}
    if 1 in sizes:
        i1 = sizes.index(1)
        ratio = {n: statistics.median(rm[i] / rm[i1] for rm in round_medians) for i, n in enumerate(sizes)}
    out = {
        "schema": SCHEMA,
        "model": backend.model_id,
        "backend": backend.name,
        "numerics": getattr(backend, "numerics", None),
        "threads": threads,
        "cpu": kernels.cpu_info().summary,
        "context_tokens": context_tokens,
        "repeats": repeats,
        "rounds": rounds,
        "median": "T(n): median over rounds of the round's median of `repeats` forwards; ratio_to_t1: median over "
                  "rounds of the round's T(n)/T(1); bandwidth: median over rounds of each round's median of 3 passes",
        "sizes": sizes,
        "raw_ms": raw,
        "t_ms": t_ms,
        "ratio_to_t1": ratio,
        "bandwidth_bytes_per_s": bw,
    }
    if is_llama:
        from .backends.llama_cpp import system_info

        out["build"] = system_info()
        out["bimm_isa"] = kernels.bimm_isa()
        out["weight_bytes"] = matmul_weight_bytes(backend.path)
        if bw:
            bw_med = statistics.median(bw)
            out["bandwidth_median_bytes_per_s"] = bw_med
            out["weight_read_ms"] = 1000.0 * out["weight_bytes"] / bw_med
            if 1 in t_ms:
                out["t1_over_weight_read"] = t_ms[1] / out["weight_read_ms"]
        if peak and threads:
            out["peak_macs"] = kernels.peak_macs(threads)
    return out


def format_profile(p: dict) -> str:
    """The report as text (what ``speculative profile`` prints)."""
    lines = [f"verification cost T(n) of {p['model']} on {p['backend']}"
             + (f" ({p['numerics']} numerics)" if p.get("numerics") else "")
             + f", {p['threads']} threads, context {p['context_tokens']}; {p['cpu']}",
             f"(median over {p['rounds']} interleaved rounds of each round's median of {p['repeats']} forwards)",
             f"{'tokens':>6} {'T(n) ms':>9} {'T(n)/T(1)':>10} {'ms/token':>9} {'best speedup at k = n-1':>24}"]
    t1 = p["t_ms"].get(1)
    for n in p["sizes"]:
        t = p["t_ms"][n]
        ratio = p["ratio_to_t1"].get(n)
        ceiling = f"{n / ratio:.2f}x" if ratio else "-"
        lines.append(f"{n:>6} {t:>9.1f} {ratio if ratio else float('nan'):>10.2f} {t / n:>9.2f} {ceiling:>24}")
    if "weight_bytes" in p:
        lines.append(f"weights read per forward: {p['weight_bytes'] / 2**30:.3f} GiB")
    if p.get("bandwidth_median_bytes_per_s"):
        lines.append(f"read bandwidth ({p['threads']} threads): {p['bandwidth_median_bytes_per_s'] / 1e9:.1f} GB/s; "
                     f"reading the weights once: {p['weight_read_ms']:.1f} ms"
                     + (f"; T(1) = {p['t1_over_weight_read']:.2f}x that" if t1 else ""))
    if p.get("peak_macs"):
        lines.append(f"integer multiply-add peak ({p.get('bimm_isa')}, {p['threads']} threads): "
                     f"{p['peak_macs'] / 1e9:.0f} GMAC/s")
    return "\n".join(lines)
