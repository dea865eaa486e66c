"""Modified rejection sampling on distributions from the real models.

p comes from the real SmolLM2 target and q from its weaker Q2_K re-quantization
(the test drafter) at a few positions of a real prompt, both processed with the
same temperature / top-k / top-p. The verification step alone (no further model
calls) runs many times on them: the emitted token must be distributed as p.

Tokens outside the union of the supports of p and q can never be emitted, so
both are restricted to that union before sampling (the verification code does
not depend on the vocabulary size); the full-vocabulary case keeps all 49,152.
Criterion: chi-square goodness of fit (cells with expected count < 5 pooled),
p-value > 1e-3 with a fixed seed; the same harness rejects a wrong residual.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from speculative.backends.base import ForwardRequest
from speculative.config import SamplingParams
from speculative.drafters import build_drafter
from speculative.engine import SpeculativeGenerator
from speculative.sampling import Sampler, sample_from
from speculative.verification import VerifyResult, rejection_sample

PASS_P = 1e-3


@pytest.fixture(scope="module")
def real_rows(smol, smol_weak_path, prompts10):
    """Target and draft logits at 3 positions of a real prompt and its greedy continuation."""
    drafter = build_drafter(f"model:{smol_weak_path}", smol)
    try:
        gen = SpeculativeGenerator(smol)
        ids = gen.encode_prompt(prompts10[0]["turns"][0])
        cont = gen.generate(ids, max_new_tokens=12, draft_policy="fixed").token_ids
        seq = ids + cont
        # the first 3 positions (of the prompt's end and the continuation) where p and q differ, but not
        # entirely, under every sampling setting below: where both put all their mass on one token the check
        # would pass whatever the verifier did
        settings = [Sampler(SamplingParams(temperature=1.0, top_k=40)), Sampler(SamplingParams(temperature=0.7, top_p=0.9)),
                    Sampler(SamplingParams(temperature=1.0))]
        rows = []
        for cut in [len(ids) + k for k in (0, 4, 10, 2, 6, 8, 1, 3, 5, 7, 9, 11, 12)]:
            tl, dl = _next_logits(smol, seq[:cut]), _next_logits(drafter.model, seq[:cut])
            if all(0.02 < 0.5 * np.abs(s.probs(tl) - s.probs(dl)).sum() < 0.98 for s in settings):
                rows.append((tl, dl))
            if len(rows) == 3:
                return rows
        raise AssertionError(f"only {len(rows)} positions where the target and draft distributions differ")
    finally:
        drafter.close()


def _next_logits(backend, tokens):
    backend.truncate(0, 0)
    out = backend.forward([ForwardRequest(0, tokens, logits="last")])[0].logits[-1].copy()
    backend.truncate(0, 0)
    return out


def _wrong(target_probs, draft, draft_probs, rng):
    x = draft[0]
    p = target_probs(0)
    if rng.random() * draft_probs[0][x] < p[x]:
        return VerifyResult(1, 0)
    return VerifyResult(0, sample_from(p, rng))  # bug: samples p instead of the residual


def _emitted_counts(p, q, n, rng, verifier=rejection_sample):
    counts = np.zeros(p.shape[0], dtype=np.int64)
    for _ in range(n):
        x = sample_from(q, rng)
        res = verifier(lambda i: p, [x], q[None], rng)
        counts[x if res.num_accepted == 1 else res.next_token] += 1
    return counts


def _pvalue(counts, p):
    exp = p * counts.sum()
    assert counts[p == 0].sum() == 0, "a token with target probability 0 was emitted"
    big = exp >= 5
    obs = np.r_[counts[big], counts[~big].sum()]
    e = np.r_[exp[big], exp[~big].sum()]
    keep = e > 0
    if keep.sum() < 2:  # p has a single token: every emitted token must be it
        return 1.0 if obs[keep].sum() == counts.sum() else 0.0
    return stats.chisquare(obs[keep], e[keep]).pvalue


@pytest.mark.parametrize(
    "params, n",
    [
        (SamplingParams(temperature=1.0, top_k=40), 200_000),
        (SamplingParams(temperature=0.7, top_p=0.9), 200_000),
        (SamplingParams(temperature=1.0), 30_000),  # full vocabulary, no truncation
    ],
)
def test_verification_reproduces_the_real_target_distribution(real_rows, params, n):
    s = Sampler(params)
    rng = np.random.default_rng(2024)
    for i, (tl, dl) in enumerate(real_rows):
        p, q = s.probs(tl), s.probs(dl)
        assert 0.02 < 0.5 * np.abs(p - q).sum() < 0.98, "p and q should differ, but not entirely"
        if params.top_k or params.top_p < 1:
            support = np.nonzero((p > 0) | (q > 0))[0]
            p, q = p[support] / p[support].sum(), q[support] / q[support].sum()
        counts = _emitted_counts(p, q, n, rng)
        pval = _pvalue(counts, p)
        assert pval > PASS_P, f"position {i}: p-value {pval:.2e}"


def test_wrong_residual_fails_on_real_distributions(real_rows):
    s = Sampler(SamplingParams(temperature=1.0, top_k=40))
    rng = np.random.default_rng(2024)
    tl, dl = real_rows[0]
    p, q = s.probs(tl), s.probs(dl)
    support = np.nonzero((p > 0) | (q > 0))[0]
    p, q = p[support] / p[support].sum(), q[support] / q[support].sum()
    assert _pvalue(_emitted_counts(p, q, 200_000, rng, _wrong), p) < 1e-6
