"""Verification of a drafted chain: greedy matching and modified rejection sampling.

Modified rejection sampling (Leviathan, Kalman, Matias 2023, "Fast Inference
from Transformers via Speculative Decoding", section 2.3 and appendix A.1;
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling", algorithm 2): draft token x_i, drawn from q_i, is accepted with
probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection one token is
drawn from the residual distribution norm(max(0, p_i - q_i)) and the rest of the
draft is discarded. When all m draft tokens are accepted, a bonus token is drawn
from p_{m+1}. The emitted tokens are distributed exactly as the target's.

A drafter that proposes deterministically (n-gram lookup) has q_i = one-hot(x_i):
acceptance is then p_i(x_i) and the residual is p_i with x_i removed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .sampling import sample_from
from .trees import children as _children


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one drafted chain.

    Attributes:
        num_accepted: accepted draft tokens, 0..m.
        next_token: the residual sample at the first rejection, or the bonus
            token when all m were accepted. The step emits
            ``draft[:num_accepted] + [next_token]``.
    """

    num_accepted: int
    next_token: int


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)) for a token x that the drafter drew (so q(x) > 0)."""
    if q_x <= 0:
        raise ValueError("q(x) must be > 0 for a token the drafter sampled")
    return min(1.0, p_x / q_x)


def residual_distribution(p: np.ndarray, q: np.ndarray | None, draft_token: int) -> np.ndarray:
    """norm(max(0, p - q)) as float64 ``[V]``; q None means one-hot at ``draft_token``.

    If the residual has no mass (p == q up to rounding, which cannot happen
    after a genuine rejection), p itself is returned.
    """
    if q is None:
        r = np.array(p, dtype=np.float64, copy=True)
        r[draft_token] = 0.0
    else:
        r = np.maximum(np.asarray(p, dtype=np.float64) - q, 0.0)
    total = r.sum()
    if not total > 0:
        return np.asarray(p, dtype=np.float64)
    return r / total


def verify_greedy(target_choices: Sequence[int], draft: Sequence[int]) -> VerifyResult:
    """Greedy verification: accept the longest prefix equal to the target's argmax.

    Args:
        target_choices: the target's argmax at each of the m+1 verified positions.
        draft: the m draft tokens.
    """
    m = len(draft)
    n = 0
    while n < m and int(draft[n]) == int(target_choices[n]):
        n += 1
    return VerifyResult(n, int(target_choices[n]))


def rejection_sample(
    target_probs: Callable[[int], np.ndarray],
    draft: Sequence[int],
    draft_probs: np.ndarray | None,
    rng: np.random.Generator,
) -> VerifyResult:
    """Modified rejection sampling over a drafted chain.

    Args:
        target_probs: ``i -> p_i`` (float ``[V]``, processed), for i in 0..m. Called
            lazily, only up to the first rejection.
        draft: the m draft tokens x_1..x_m.
        draft_probs: ``[m, V]`` distributions the drafter sampled each x_i from,
            after the same processing as p; None for a deterministic drafter.
        rng: the request's random generator.

    Returns:
        :class:`VerifyResult`.
    """
    m = len(draft)
    for i in range(m):
        x = int(draft[i])
        p = target_probs(i)
        q = None if draft_probs is None else draft_probs[i]
        q_x = 1.0 if q is None else float(q[x])
        if q_x <= 0:
            raise ValueError(f"draft token {x} has q = 0 at position {i}: the drafter did not sample it")
        if rng.random() * q_x < p[x]:  # accept with probability min(1, p/q)
            continue
        return VerifyResult(i, sample_from(residual_distribution(p, q, x), rng))
    return VerifyResult(m, sample_from(target_probs(m), rng))


@dataclass(frozen=True)
class TreeVerifyResult:
    """Outcome of verifying a token tree.

    Attributes:
        path: accepted nodes, from a child of the root downwards (may be empty).
        next_token: the token drawn at the last accepted node (residual sample,
            or the bonus token when that node is a leaf). The step emits the
            path's tokens and then ``next_token``.
    """

    path: list[int]
    next_token: int


def verify_tree_greedy(target_choice: Callable[[int], int], tokens: Sequence[int], parents: Sequence[int]) -> TreeVerifyResult:
    """Greedy tree verification: follow the child equal to the target's argmax, as long as one exists.

    Args:
        target_choice: ``u -> argmax of the target at node u`` (u = -1: the root).
        tokens, parents: the tree (see :mod:`speculative.trees`).
    """
    ch = _children(parents)
    u, path = -1, []
    while True:
        g = int(target_choice(u))
        nxt = next((c for c in ch[u] if int(tokens[c]) == g), None)
        if nxt is None:
            return TreeVerifyResult(path, g)
        path.append(nxt)
        u = nxt


def tree_rejection_sample(
    target_probs: Callable[[int], np.ndarray],
    tokens: Sequence[int],
    parents: Sequence[int],
    child_probs: Callable[[int], np.ndarray | None] | None,
    rng: np.random.Generator,
) -> TreeVerifyResult:
    """Lossless multi-candidate verification of a token tree (recursive rejection sampling).

    At each node the children are tried in order. Children drawn i.i.d. from a
    draft distribution q (``child_probs(u)`` returns it) follow SpecInfer's
    multi-step speculative sampling (Miao et al. 2024, algorithm 2): accept child
    x with probability min(1, p(x)/q(x)), else replace p by norm(max(0, p - q)) and
    try the next child. Deterministic, distinct candidates (top-k children, as in
    Medusa and EAGLE; ``child_probs(u)`` returns None) are one-hot drafts: accept x
    with probability p(x), else zero p(x) and renormalize (Chen et al. 2023's
    recursive rejection for one-hot proposals). When no child is accepted one
    token is drawn from what remains of p, so every step's output is distributed
    exactly as the target's.

    Args:
        target_probs: ``u -> p_u`` (processed, float ``[V]``) at node u; -1 is the root.
        tokens, parents: the tree.
        child_probs: see above; None means every node's children are deterministic.
        rng: the request's random generator.
    """
    ch = _children(parents)
    u, path = -1, []
    while True:
        kids = ch[u]
        p = np.array(target_probs(u), dtype=np.float64, copy=True)
        q = child_probs(u) if (child_probs is not None and kids) else None
        accepted = None
        for c in kids:
            x = int(tokens[c])
            if q is None:
                if rng.random() < p[x]:
                    accepted = c
                    break
                p[x] = 0.0
                s = p.sum()
                if not s > 0:  # pragma: no cover - p was one-hot at x, so x was accepted
                    break
                p /= s
            else:
                q_x = float(q[x])
                if q_x <= 0:
                    raise ValueError(f"child token {x} has q = 0: the drafter did not sample it")
                if rng.random() * q_x < p[x]:
                    accepted = c
                    break
                p = residual_distribution(p, q, x)
        if accepted is None:
            return TreeVerifyResult(path, sample_from(p, rng))
        path.append(accepted)
        u = accepted

