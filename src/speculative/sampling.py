"""Logits processing: temperature, top-k, top-p, and drawing from a distribution.

One :class:`Sampler` per generation turns raw logits into the distribution that
is actually sampled from. The engine applies the *same* sampler to the target's
logits (p) and to a draft model's logits (q) before the acceptance ratio, as
modified rejection sampling requires (Leviathan et al. 2023, section 2.3).

Arrays: logits are float32 ``[n, V]`` or ``[V]``; probabilities are float64
``[V]`` rows that sum to 1 (zeros outside the top-k / top-p set).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .config import SamplingParams

# Candidate-set size tried first when truncating to top-p: a full sort of a
# 262k vocabulary costs ~15 ms, a partition plus a sort of the head ~1 ms.
_TOP_P_HEAD = 1024


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax of a float row ``[V]`` in float64 (inf/-inf safe)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x)
    e = np.exp(x - m)
    return e / e.sum()


def _top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits (ties at the boundary: numpy's partition order)."""
    if k >= logits.shape[-1]:
        return np.arange(logits.shape[-1])
    return np.argpartition(logits, -k)[-k:]


def _top_p_keep(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of most likely tokens whose mass reaches ``top_p``."""
    v = probs.shape[-1]
    head = min(_TOP_P_HEAD, v)
    while True:
        idx = np.argpartition(probs, -head)[-head:] if head < v else np.arange(v)
        order = idx[np.argsort(-probs[idx], kind="stable")]
        csum = np.cumsum(probs[order])
        if csum[-1] >= top_p or head == v:
            n_keep = int(np.searchsorted(csum, top_p, side="left")) + 1
            return order[: min(n_keep, order.shape[0])]
        head = min(v, head * 8)


def process_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed distribution of one row of logits for a sampled (temperature > 0) step.

    Args:
        logits: float ``[V]``.
        params: temperature (> 0), top_k, top_p.

    Returns:
        float64 ``[V]``, sums to 1, zero outside the kept set.
    """
    if params.temperature <= 0:
        raise ValueError("process_probs needs temperature > 0; use argmax for greedy")
    x = np.asarray(logits, dtype=np.float64) / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        keep = _top_k_mask(x, params.top_k)
        y = np.full_like(x, -np.inf)
        y[keep] = x[keep]
        x = y
    probs = softmax(x)
    if params.top_p < 1.0:
        keep = _top_p_keep(probs, params.top_p)
        out = np.zeros_like(probs)
        out[keep] = probs[keep]
        probs = out / out.sum()
    return probs


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a float ``[V]`` distribution (need not be normalized)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from an all-zero distribution")
    i = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    # guard against rounding at the very top of the cdf
    i = min(i, probs.shape[-1] - 1)
    while probs[i] <= 0:  # pragma: no cover - only on float edge cases
        i -= 1
    return i


class Sampler:
    """Turns raw logits into the distribution sampled from, for one request.

    History-dependent processing (penalties, logit bias) hooks in through
    :meth:`adjust`: row ``i`` of a verification block is adjusted with the
    history ``prefix + draft[:i]``, exactly as token-by-token decoding would.
    The base sampler has no history-dependent processing.
    """

    #: True when :meth:`adjust` depends on the history (penalties); callers skip it otherwise.
    uses_history: bool = False

    def __init__(self, params: SamplingParams):
        self.params = params.validate()

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def adjust(self, logits: np.ndarray, history: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        """Logits ``[n, V]`` after history-dependent processing; row i sees ``history + draft[:i]``.

        The base sampler has none and returns ``logits`` unchanged.
        """
        return logits

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        """Greedy choices of adjusted logits ``[n, V]`` -> int64 ``[n]`` (ties: lowest id)."""
        return np.argmax(logits, axis=-1)

    def probs(self, logits_row: np.ndarray) -> np.ndarray:
        """Processed distribution of one adjusted logits row (temperature > 0)."""
        return process_probs(logits_row, self.params)

    def sample(self, logits_row: np.ndarray, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
        """One token from an adjusted logits row; returns (token, distribution or None if greedy)."""
        if self.greedy:
            return int(np.argmax(logits_row)), None
        p = self.probs(logits_row)
        return sample_from(p, rng), p
