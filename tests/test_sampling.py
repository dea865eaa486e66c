import numpy as np
import pytest

from speculative.config import SamplingParams
from speculative.sampling import Sampler, process_probs, sample_from, softmax


pytestmark = pytest.mark.quick


def brute_force(logits, temperature, top_k, top_p):
    """Reference: temperature, then top-k, then top-p by a full sort."""
    x = logits / temperature
    if top_k:
        kth = np.sort(x)[-top_k]
        x = np.where(x >= kth, x, -np.inf)
    p = softmax(x)
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        c = np.cumsum(p[order])
        n = int(np.searchsorted(c, top_p, side="left")) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:n]] = True
        p = np.where(keep, p, 0)
        p = p / p.sum()
    return p


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.9), (0.8, 50, 0.5)])
def test_process_probs_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng(1)
    for v in (10, 300, 5000):
        logits = rng.normal(size=v).astype(np.float32) * 3
        got = process_probs(logits, SamplingParams(temperature, top_k, top_p))
        want = brute_force(logits.astype(np.float64), temperature, min(top_k, v) if top_k else 0, top_p)
        np.testing.assert_allclose(got, want, atol=1e-12)
        assert abs(got.sum() - 1) < 1e-12


def test_top_p_large_vocab_needs_wide_head():
    # a flat distribution over 262,144 tokens forces the head search to widen
    logits = np.zeros(262_144, dtype=np.float32)
    p = process_probs(logits, SamplingParams(1.0, 0, 0.5))
    assert (p > 0).sum() == 131_072


def test_sample_from_frequencies():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample_from(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0
    np.testing.assert_allclose(draws, p, atol=0.015)


def test_greedy_sampler_is_argmax():
    s = Sampler(SamplingParams(temperature=0.0))
    logits = np.array([[0.0, 2.0, 2.0, 1.0]], dtype=np.float32)
    assert s.argmax(logits).tolist() == [1]  # ties go to the lowest id
    tok, q = s.sample(logits[0], np.random.default_rng(0))
    assert tok == 1 and q is None
