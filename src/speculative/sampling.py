"""Logits processing: temperature, top-k, top-p, and drawing from a distribution.

One :class:`Sampler` per generation turns raw logits into the distribution that
is actually sampled from. The engine applies the *same* sampler to the target's
logits (p) and to a draft model's logits (q) before the acceptance ratio, as
modified rejection sampling requires (Leviathan et al. 2023, section 2.3).

Arrays: logits are float32 ``[n, V]`` or ``[V]``; probabilities are float64
``[V]`` rows that sum to 1 (zeros outside the top-k / top-p set).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
        logits: float ``[V]`` (after logit bias and penalties).
        params: temperature (> 0), top_k, top_p, min_p.

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
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
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

    History-dependent processing (logit bias, penalties) happens in
    :meth:`adjust`: row ``i`` of a verification block is adjusted with the
    history ``history + draft[:i]``, exactly as token-by-token decoding would.

    Args:
        params: the request's :class:`SamplingParams`.
        prompt_len: tokens of the history that are the prompt (frequency and
            presence penalties count output tokens only).
        min_tokens: at output positions before this one (0-based, counted from the
            end of the prompt), the logits of ``suppress`` are set to -inf.
        suppress: token ids masked before ``min_tokens`` (the end-of-generation set).
    """

    def __init__(self, params: SamplingParams, prompt_len: int = 0, min_tokens: int = 0,
                 suppress: Iterable[int] = ()):
        self.params = params.validate()
        self.prompt_len = prompt_len
        self.min_tokens = int(min_tokens)
        self._suppress = np.fromiter(sorted(set(suppress)), dtype=np.int64) if min_tokens > 0 else None
        if self._suppress is not None and not self._suppress.size:
            self._suppress = None
        #: True when :meth:`adjust` changes logits; callers skip it otherwise.
        self.uses_history = params.uses_history or self._suppress is not None
        if params.logit_bias:
            self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
            self._bias_vals = np.fromiter(params.logit_bias.values(), dtype=np.float32)
        else:
            self._bias_ids = None

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def adjust(self, logits: np.ndarray, history: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        """Logits ``[n, V]`` after logit bias, penalties and the ``min_tokens`` mask; row i sees
        ``history + draft[:i]`` (so it is output position ``len(history) - prompt_len + i``).

        Returns a new float32 array (the input, often backend memory, is not modified),
        or ``logits`` itself when there is nothing to apply.
        """
        if not self.uses_history:
            return logits
        p = self.params
        if not p.uses_history and len(history) - self.prompt_len >= self.min_tokens:
            return logits  # past min_tokens, nothing else to apply
        out = np.array(logits, dtype=np.float32, copy=True)
        v = out.shape[-1]
        counts: dict[int, int] = {}
        for t in history[self.prompt_len :]:
            counts[t] = counts.get(t, 0) + 1
        seen = set(history) if p.repetition_penalty != 1.0 else None
        for i in range(out.shape[0]):
            if self._suppress is not None and len(history) - self.prompt_len + i < self.min_tokens:
                out[i, self._suppress[self._suppress < v]] = -np.inf
            if i > 0:
                t = int(draft[i - 1])
                counts[t] = counts.get(t, 0) + 1
                if seen is not None:
                    seen.add(t)
            row = out[i]
            if self._bias_ids is not None:
                ok = self._bias_ids < v
                row[self._bias_ids[ok]] += self._bias_vals[ok]
            if seen:
                ids = np.fromiter(seen, dtype=np.int64, count=len(seen))
                ids = ids[ids < v]
                vals = row[ids]
                row[ids] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if counts and (p.frequency_penalty or p.presence_penalty):
                ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                keep = ids < v
                row[ids[keep]] -= p.frequency_penalty * c[keep] + p.presence_penalty
        return out

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

    def logprobs(self, logits_row: np.ndarray) -> np.ndarray:
        """Log-probabilities that OpenAI's ``logprobs`` report for an adjusted row.

        Sampling: the log of the processed distribution (-inf outside the kept set).
        Greedy: log-softmax of the adjusted logits (temperature 1, no truncation).
        """
        if self.greedy:
            x = np.asarray(logits_row, dtype=np.float64)
            m = x.max()
            return x - m - np.log(np.exp(x - m).sum())
        with np.errstate(divide="ignore"):
            return np.log(self.probs(logits_row))
