"""Acceptance rule and losslessness of modified rejection sampling on hand-built p and q.

Statistical tests: a fixed seed, 200,000 samples, a chi-square goodness-of-fit
test of the emitted tokens against the target distribution. The test accepts
at p-value > 1e-3; the same harness run with a wrong residual (sampling from p
instead of norm(max(0, p - q)) after a rejection) must give p-value < 1e-6,
which shows the test has the power to fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from speculative.config import SamplingParams
from speculative.sampling import Sampler, sample_from, softmax
from speculative.verification import (
    VerifyResult,
    acceptance_probability,
    rejection_sample,
    residual_distribution,
    verify_greedy,
)


pytestmark = pytest.mark.quick

N_SAMPLES = 200_000
PASS_P = 1e-3
FAIL_P = 1e-6


# ---- acceptance rule ---------------------------------------------------------------


def test_acceptance_probability_is_min_one_ratio():
    assert acceptance_probability(0.2, 0.4) == pytest.approx(0.5)
    assert acceptance_probability(0.4, 0.2) == 1.0
    assert acceptance_probability(0.0, 0.3) == 0.0
    with pytest.raises(ValueError):
        acceptance_probability(0.1, 0.0)


def test_residual_is_normalized_positive_part():
    p = np.array([0.5, 0.2, 0.3, 0.0])
    q = np.array([0.2, 0.5, 0.1, 0.2])
    r = residual_distribution(p, q, draft_token=1)
    np.testing.assert_allclose(r, np.array([0.3, 0.0, 0.2, 0.0]) / 0.5)
    # deterministic draft: q one-hot at the draft token
    r1 = residual_distribution(p, None, draft_token=0)
    np.testing.assert_allclose(r1, np.array([0.0, 0.2, 0.3, 0.0]) / 0.5)


def test_verify_greedy():
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == VerifyResult(3, 8)  # all accepted + bonus
    assert verify_greedy([5, 9, 7, 8], [5, 6, 7]) == VerifyResult(1, 9)  # first mismatch -> target's token
    assert verify_greedy([4, 6, 7, 8], [5, 6, 7]) == VerifyResult(0, 4)
    assert verify_greedy([3], []) == VerifyResult(0, 3)  # plain step


def test_acceptance_frequency_matches_min_ratio():
    rng = np.random.default_rng(7)
    p = np.array([0.1, 0.6, 0.3])
    q = np.array([0.5, 0.3, 0.2])
    n = 100_000
    acc = sum(rejection_sample(lambda i: p, [0], q[None], rng).num_accepted for _ in range(n)) / n
    assert acc == pytest.approx(min(1, 0.1 / 0.5), abs=0.005)


def test_bonus_token_drawn_from_next_position_when_all_accepted():
    rng = np.random.default_rng(3)
    p_chain = [np.array([0.0, 1.0, 0.0]), np.array([0.0, 0.0, 1.0]), np.array([0.25, 0.0, 0.75])]
    q = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    outs = [rejection_sample(lambda i: p_chain[i], [1, 2], q, rng) for _ in range(20_000)]
    assert all(o.num_accepted == 2 for o in outs)  # p = q: always accepted
    bonus = np.bincount([o.next_token for o in outs], minlength=3) / len(outs)
    np.testing.assert_allclose(bonus, p_chain[2], atol=0.01)


def test_zero_draft_probability_is_an_error():
    with pytest.raises(ValueError):
        rejection_sample(lambda i: np.array([0.5, 0.5]), [1], np.array([[1.0, 0.0]]), np.random.default_rng(0))


# ---- losslessness: joint distribution of the first two emitted tokens ---------------


def _wrong_residual_sample(target_probs, draft, draft_probs, rng):
    """A broken verifier: on rejection it samples from p instead of the residual."""
    for i, x in enumerate(draft):
        p = target_probs(i)
        q_x = 1.0 if draft_probs is None else draft_probs[i][x]
        if rng.random() * q_x < p[x]:
            continue
        return VerifyResult(i, sample_from(p, rng))
    return VerifyResult(len(draft), sample_from(target_probs(len(draft)), rng))


def _two_token_joint(p1, p2, q1, q2, verifier, rng, deterministic=False):
    """Empirical joint of the first two emitted tokens of a k=2 speculative decoder.

    Target: t1 ~ p1, t2 ~ p2[t1]. Drafter: x1 ~ q1, x2 ~ q2[x1] (or argmax when
    deterministic, with q = None as for n-gram drafts).
    """
    v = p1.shape[0]
    counts = np.zeros((v, v), dtype=np.int64)
    for _ in range(N_SAMPLES):
        if deterministic:
            x1 = int(np.argmax(q1))
            x2 = int(np.argmax(q2[x1]))
            qs = None
        else:
            x1 = sample_from(q1, rng)
            x2 = sample_from(q2[x1], rng)
            qs = np.stack([q1, q2[x1]])
        rows = [p1, p2[x1], p2[x1]]  # the bonus row is never reached at position 2 here
        res = verifier(lambda i: rows[i], [x1, x2], qs, rng)
        if res.num_accepted == 0:
            t1 = res.next_token
            t2 = sample_from(p2[t1], rng)  # the next step is a fresh step from p2[t1]
        elif res.num_accepted == 1:
            t1, t2 = x1, res.next_token
        else:
            t1, t2 = x1, x2
        counts[t1, t2] += 1
    return counts


def _chi2_pvalue(counts, expected_probs):
    exp = expected_probs.ravel() * counts.sum()
    obs = counts.ravel()
    keep = exp > 0
    assert obs[~keep].sum() == 0, "a token with target probability 0 was emitted"
    return stats.chisquare(obs[keep], exp[keep]).pvalue


def _case(name, v=6, seed=0):
    """Hand-built target and draft distributions for the named case."""
    rng = np.random.default_rng(seed)
    logits_p1 = rng.normal(size=v) * 1.5
    logits_p2 = rng.normal(size=(v, v)) * 1.5
    logits_q1 = logits_p1 + rng.normal(size=v)
    logits_q2 = logits_p2 + rng.normal(size=(v, v))
    if name == "general":
        sp = SamplingParams(1.0)
    elif name == "temperature":
        sp = SamplingParams(0.6)
    elif name == "top_k":
        sp = SamplingParams(1.0, top_k=3)
    elif name == "top_p":
        sp = SamplingParams(0.9, top_p=0.8)
    elif name in ("q_zero_where_p_positive", "deterministic"):
        sp = SamplingParams(1.0)
    else:
        raise ValueError(name)
    s = Sampler(sp)
    p1 = s.probs(logits_p1)
    p2 = np.stack([s.probs(r) for r in logits_p2])
    q1 = s.probs(logits_q1)
    q2 = np.stack([s.probs(r) for r in logits_q2])
    if name == "q_zero_where_p_positive":
        # the drafter never proposes tokens 0 and 1, which the target likes
        for q in [q1, *q2]:
            q[:2] = 0
            q /= q.sum()
        p1 = softmax(np.r_[3.0, 2.0, logits_p1[2:]])
    return p1, p2, q1, q2


CASES = ["general", "temperature", "top_k", "top_p", "q_zero_where_p_positive", "deterministic"]


@pytest.mark.parametrize("case", CASES)
def test_rejection_sampling_reproduces_target(case):
    p1, p2, q1, q2 = _case(case)
    counts = _two_token_joint(
        p1, p2, q1, q2, rejection_sample, np.random.default_rng(12345), deterministic=(case == "deterministic")
    )
    expected = p1[:, None] * p2
    pval = _chi2_pvalue(counts, expected)
    assert pval > PASS_P, f"{case}: chi-square p-value {pval:.2e}"


@pytest.mark.parametrize("case", ["general", "top_k", "deterministic"])
def test_wrong_residual_is_detected(case):
    """Power check: the same harness rejects a verifier with a wrong residual."""
    p1, p2, q1, q2 = _case(case)
    counts = _two_token_joint(
        p1, p2, q1, q2, _wrong_residual_sample, np.random.default_rng(12345), deterministic=(case == "deterministic")
    )
    pval = _chi2_pvalue(counts, p1[:, None] * p2)
    assert pval < FAIL_P, f"{case}: a wrong residual went undetected (p-value {pval:.2e})"
