"""The shipped EAGLE-style head of Qwen2.5-Coder-1.5B-Instruct (``eagle:qwen2.5-coder-1.5b-instruct-eagle``).

* greedy identity against plain greedy decoding on Spec-Bench and code prompts with the fixed policy
  (k = 4), drafts accepted and rejected (asserted) (token trees of heads: test_shipped_drafters);
* sampling through it: the head proposes greedily (q one-hot), and chain verification of its real
  draft against the real target's p emits tokens distributed as p (chi-square); a verifier that
  forgets to remove the rejected token from the residual is caught;
* a corrupt or mismatched drafter file is refused with one line naming the file.

Prompts are at most ~200 tokens and generations 32 tokens (CI budget); marked ``qwen``.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from conftest import FrozenCost, assert_greedy_identical, next_logits_fresh
from test_sampling_real import _wrong as _forgetful  # samples p itself on rejection, not the residual
from scipy import stats

from speculative.backends.base import ForwardRequest
from speculative.config import SamplingParams
from speculative.drafters.base import NoDrafter
from speculative.engine import SpeculativeGenerator
from speculative.sampling import Sampler, sample_from
from speculative.verification import rejection_sample

pytestmark = pytest.mark.qwen

TARGET = "qwen2.5-coder-1.5b-instruct"
HEAD = "qwen2.5-coder-1.5b-instruct-eagle"
FOLDER = Path(str(resources.files("speculative") / "data" / "drafters" / HEAD))
CODE = "Write a Python function that merges two sorted lists into one sorted list, with a docstring."


@pytest.fixture(scope="module")
def gen():
    g = SpeculativeGenerator.from_pretrained(TARGET, drafter=f"eagle:{HEAD}", n_ctx=2048)
    yield g
    g.close()


def test_head_is_greedy_identical_with_drafts_accepted_and_rejected(gen, prompts10):
    plain_gen = SpeculativeGenerator(gen.target, NoDrafter())
    accepted = rejected = 0
    for text in [CODE] + [r["turns"][0] for r in prompts10[:2]]:
        ids = gen.encode_prompt(text)
        plain = plain_gen.generate(ids, max_new_tokens=32).token_ids
        for g, label in ((gen, "chain"),):
            r = g.generate(ids, max_new_tokens=32, num_speculative_tokens=4, draft_policy="fixed")
            assert_greedy_identical(gen.target, ids, plain, r.token_ids, exact=True, label=f"{label}: {text[:30]}")
            accepted += r.stats.accepted_tokens
            rejected += r.stats.draft_tokens - r.stats.accepted_tokens
    assert accepted > 0 and rejected > 0, (accepted, rejected)


def test_the_head_keeps_its_calibration_and_asks_for_each_further_position(gen):
    """The head's calibration is kept across requests (it grows over the module's requests); under the
    adaptive policy the head asks, before each further draft token, whether it is worth drafting, at
    positions 1 .. k - 1 of its draft (never 0: the first token is always drafted)."""
    cal = gen.drafter.calibrations.get("")
    # a flat verification cost of 1 s per forward: the head's own cost is negligible against it on any machine, so the
    # policy never silences it as a sure loss (with 30 ms, an AVX2-only Zen 3, whose head steps cost more, silenced it
    # for the second request)
    adaptive = SpeculativeGenerator(gen.target, gen.drafter, cost_model=FrozenCost([1, 16], [1.0, 1.0]))
    asked = []
    cal.worth_drafting = lambda cum, position, min_confidence: asked.append(position) or True
    try:
        ids = gen.encode_prompt(CODE)
        adaptive.generate(ids, max_new_tokens=16, num_speculative_tokens=4, draft_policy="adaptive")
        before = sum(n for _, n in cal.counts.values())
        adaptive.generate(ids, max_new_tokens=16, num_speculative_tokens=4, draft_policy="adaptive")
    finally:
        del cal.worth_drafting
    assert before > 0 and sum(n for _, n in cal.counts.values()) > before
    assert asked and min(asked) == 1 and max(asked) <= 3, asked


N_SAMPLES = 20000


@pytest.fixture(scope="module")
def real_draft(gen):
    """The head's first draft token on a real code prompt (q one-hot: the head drafts greedily) and the
    real target's temperature-1 distribution there."""
    ids = gen.encode_prompt(CODE)
    d = gen.drafter
    st = d.start(ids)
    gen.target.truncate(0, 0)
    res = gen.target.forward([ForwardRequest(0, ids, logits="all", hidden=True)])[0]
    gen.target.truncate(0, 0)
    d.observe_hidden(st, 0, res.hidden)
    prop = d.propose(st, ids, 1, None, np.random.default_rng(0))
    assert len(prop.tokens) == 1
    p = Sampler(SamplingParams(temperature=1.0)).probs(next_logits_fresh(gen.target, ids))
    q = np.zeros_like(p)
    q[prop.tokens[0]] = 1.0
    assert 0.05 < p[prop.tokens[0]] < 0.97, p[prop.tokens[0]]  # a draft that is sometimes rejected
    return p, q


def _pvalue(p, q, verifier):
    rng = np.random.default_rng(5)
    counts = np.zeros(p.shape[0], dtype=np.int64)
    for _ in range(N_SAMPLES):
        x = sample_from(q, rng)
        res = verifier(lambda i: p, [x], q[None], rng)
        counts[x if res.num_accepted == 1 else res.next_token] += 1
    cells = [int(t) for t in np.argsort(-p)[:30]]
    obs = [counts[t] for t in cells] + [N_SAMPLES - counts[cells].sum()]
    exp = [p[t] * N_SAMPLES for t in cells] + [(1 - p[cells].sum()) * N_SAMPLES]
    return stats.chisquare(obs, np.asarray(exp) * sum(obs) / sum(exp)).pvalue


def test_sampling_through_the_head_is_lossless(real_draft):
    p, q = real_draft
    assert _pvalue(p, q, rejection_sample) > 1e-3


def test_the_sampling_test_catches_a_forgetful_residual(real_draft):
    p, q = real_draft
    assert _pvalue(p, q, _forgetful) < 1e-6


@pytest.mark.parametrize("damage", ["truncated", "other-target"])
def test_damaged_head_is_refused_naming_the_file(tmp_path, damage, capsys):
    from speculative.cli import main

    bad = tmp_path / "bad-head"
    shutil.copytree(FOLDER, bad)
    if damage == "truncated":
        f = bad / "head.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    else:
        import json

        meta = json.loads((bad / "drafter.json").read_text())
        meta["hidden_size"] = 896
        (bad / "drafter.json").write_text(json.dumps(meta))
    rc = main(["generate", "--target", TARGET, "--drafter", f"eagle:{bad}", "--max-new-tokens", "4", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and bad.name in err[0], err
    assert "Traceback" not in "\n".join(err)
