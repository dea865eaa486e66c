"""``speculative check``: its statistics, its power against wrong verification on real SmolLM2
distributions, and short end-to-end runs of the command.

Power check: positions of real greedy runs of SmolLM2-135M-Instruct, p from the target and q from the
shipped 1-layer draft model (temperature 1, full vocabulary). The check's own sampling test (chi-square
per position, Holm at alpha = 0.01 over the positions, fixed seed) must pass the engine's
``rejection_sample`` and fail three wrong verifications: sampling p instead of the residual after a
rejection, drawing from max(0, p - q) without renormalizing it (the missing mass lands on the last
token id), and ignoring q (accepting x with probability min(1, p(x))).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import SequenceStub
from speculative.check import (
    CheckConfig,
    Position,
    collect_positions,
    emitted_counts,
    goodness_of_fit,
    holm,
    homogeneity,
    sampling_part,
)
from speculative.cli import main
from speculative.config import SamplingParams
from speculative.drafters import build_drafter
from speculative.engine import SpeculativeGenerator
from speculative.sampling import sample_from
from speculative.verification import VerifyResult, rejection_sample, residual_distribution

DRAFT_MODEL = "model:smollm2-135m-instruct-draft"
ALPHA = 0.01


# ---- the statistics ---------------------------------------------------------------------------


def test_holm_matches_the_step_down_definition():
    rej, adj = holm([0.01, 0.04, 0.03, 0.005], 0.05)
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, max(0.06, 0.04*1) = 0.06
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rej == [True, False, False, True]
    assert holm([], 0.05) == ([], [])


def test_goodness_of_fit_pools_cells_and_fails_impossible_tokens():
    rng = np.random.default_rng(0)
    p = np.r_[0.5, 0.3, 0.2 * np.full(1000, 1e-3)]
    counts = np.bincount(rng.choice(p.size, size=5000, p=p), minlength=p.size)
    t = goodness_of_fit(counts, p, max_cells=32)
    assert t["cells"] == 3 and t["pvalue"] > ALPHA  # two big tokens + the pooled tail
    q = p.copy()
    q[2] = 0.0
    counts[2] += 1
    assert goodness_of_fit(counts, q / q.sum(), 32)["pvalue"] == 0.0


def test_homogeneity_detects_a_shift_and_not_noise():
    rng = np.random.default_rng(1)
    a, b = rng.choice(5, 2000, p=[0.4, 0.3, 0.2, 0.05, 0.05]), rng.choice(5, 2000, p=[0.4, 0.3, 0.2, 0.05, 0.05])
    assert homogeneity(list(a), list(b), 32)["pvalue"] > ALPHA
    c = rng.choice(5, 2000, p=[0.3, 0.4, 0.2, 0.05, 0.05])
    assert homogeneity(list(a), list(c), 32)["pvalue"] < 1e-6


def test_config_validation():
    from speculative.errors import ConfigError

    for bad in ({"alpha": 0.0}, {"alpha": float("nan")}, {"samples": 10}, {"tv": 1.5}, {"tie_gap": -1.0},
                {"sampling": SamplingParams(temperature=0.0)}, {"e2e_tokens": 2}):
        with pytest.raises(ConfigError):
            CheckConfig(**bad).validate()


class _FakeTarget(SequenceStub):
    """Just what ``greedy_part`` reads of a target: token texts and a forward for the top-2 gap."""

    def __init__(self, batch_invariant, gap):
        self.batch_invariant, self.gap = batch_invariant, gap

    def token_text(self, i):
        return f"<{i}>"

    def forward(self, reqs):
        from speculative.backends.base import ForwardResult

        return [ForwardResult(np.array([[0.0, 5.0, 5.0 - self.gap, 1.0]], dtype=np.float32))]


class _FakeGen:
    """Plain greedy emits 1 1 1 1; the speculative run diverges at new token 2 (token 2 instead of 1)."""

    def __init__(self, target):
        self.target = target

    def generate(self, ids, speculative=True, **kw):
        from types import SimpleNamespace

        toks = [1, 1, 2, 1] if speculative else [1, 1, 1, 1]
        return SimpleNamespace(token_ids=toks, stats=SimpleNamespace(draft_tokens=3, accepted_tokens=1))


@pytest.mark.parametrize("invariant, gap, verdict", [(True, 1e-4, "fail"), (False, 1e-4, "near-tie"),
                                                      (False, 0.5, "fail")])
def test_greedy_divergence_is_a_near_tie_only_on_a_batch_variant_backend(invariant, gap, verdict):
    from speculative.check import greedy_part

    (row,) = greedy_part(_FakeGen(_FakeTarget(invariant, gap)), [[7, 8]], CheckConfig(tie_gap=0.05))
    assert row["verdict"] == verdict
    d = row["divergence"]
    assert d["index"] == 2 and d["plain"] == {"id": 1, "text": "<1>"} and d["speculative"]["id"] == 2
    assert d["top2_gap"] == pytest.approx(gap, rel=1e-2)  # float32 logits


# ---- wrong verifications fail on real distributions --------------------------------------------


def _sample_p_on_rejection(target_probs, draft, draft_probs, rng):
    x, p = draft[0], target_probs(0)
    q_x = 1.0 if draft_probs is None else draft_probs[0][x]
    if rng.random() * q_x < p[x]:
        return VerifyResult(1, 0)
    return VerifyResult(0, sample_from(p, rng))  # bug: p instead of norm(max(0, p - q))


def _unnormalized_residual(target_probs, draft, draft_probs, rng):
    x, p = draft[0], target_probs(0)
    q = draft_probs[0]
    if rng.random() * q[x] < p[x]:
        return VerifyResult(1, 0)
    cdf = np.cumsum(np.maximum(p - q, 0.0))  # bug: max(0, p - q) not divided by its mass
    return VerifyResult(0, min(int(np.searchsorted(cdf, rng.random(), side="right")), p.shape[0] - 1))


def _q_ignored(target_probs, draft, draft_probs, rng):
    x, p = draft[0], target_probs(0)
    if rng.random() < min(1.0, p[x]):  # bug: min(1, p(x)) instead of min(1, p(x) / q(x))
        return VerifyResult(1, 0)
    return VerifyResult(0, sample_from(residual_distribution(p, draft_probs[0], x), rng))


@pytest.fixture(scope="module")
def real_positions():
    """6 positions of real greedy runs: p from SmolLM2, q from the shipped draft model (temperature 1)."""
    from speculative.backends import load_backend

    # one thread: llama.cpp's thread barrier spins, and stalls for seconds per forward on a busy shared CPU
    smol = load_backend("smollm2-135m-instruct", n_ctx=1024, n_threads=1)
    drafter = build_drafter(DRAFT_MODEL + ",threads=1", smol)
    try:
        gen = SpeculativeGenerator(smol, drafter)
        cfg = CheckConfig(positions=6, samples=3000, max_new_tokens=24).validate()
        prompts = [gen.encode_prompt(t) for t in ("Name three colors of the rainbow.", "What is 12 times 12?")]
        conts = [gen.generate(ids, max_new_tokens=24, speculative=False).token_ids for ids in prompts]
        positions = collect_positions(gen, prompts, conts, cfg)
    finally:
        drafter.close()
        smol.close()
    assert len(positions) == 6 and all(pos.q is not None for pos in positions)
    return cfg, positions


@pytest.mark.parametrize("wrong", [None, _sample_p_on_rejection, _unnormalized_residual, _q_ignored])
def test_sampling_test_passes_the_engine_and_fails_wrong_verifications(real_positions, wrong):
    cfg, positions = real_positions
    rows = sampling_part(positions, cfg, verifier=wrong or rejection_sample)
    rejected, _ = holm([r["pvalue"] for r in rows], ALPHA)
    pv = ", ".join(f"{r['pvalue']:.1e}" for r in rows)
    if wrong is None:
        assert not any(rejected), f"the engine's verification failed: p-values {pv}"
    else:
        assert sum(rejected) >= 3, f"{wrong.__name__} went undetected at most positions: p-values {pv}"


def test_tree_verification_of_deterministic_siblings(real_positions):
    """tree_rejection_sample with top-3 deterministic children (as EAGLE/Medusa trees) emits p."""
    _, positions = real_positions
    rng = np.random.default_rng(5)
    for pos in positions[:2]:
        tree = Position(pos.prompt, pos.offset, pos.p, [int(i) for i in np.argsort(-pos.q)[:3]], None, True)
        assert goodness_of_fit(emitted_counts(tree, 3000, rng), pos.p, 32)["pvalue"] > ALPHA / 2


# ---- the command ---------------------------------------------------------------------------


SMALL = ["--positions", "6", "--samples", "3000", "--e2e-prompts", "1", "--e2e-samples", "80", "--k", "4", "--max-new-tokens",
         "24", "--threads", "1", "--quiet"]


@pytest.mark.parametrize("drafter", ["ngram", DRAFT_MODEL])
def test_check_command_passes_a_lossless_drafter(capsys, tmp_path, drafter):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Count from one to ten in words, then count back down."}\n'
                       '{"turns": ["Name the four seasons, then name them again in reverse order.", "Thanks"]}\n')
    out = tmp_path / "check.json"
    code = main(["check", "--target", "smollm2-135m-instruct", "--drafter", drafter, "--prompts", str(prompts), *SMALL,
                 "--json-out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "RESULT: PASS" in text and len(text.splitlines()) <= 24
    rep = json.loads(out.read_text())
    assert rep["passed"] and rep["batch_invariant"] and rep["prompts"] == 2 and rep["tests"] == 6 + 3
    assert all(g["verdict"] == "identical" for g in rep["parts"]["greedy"]["prompts"])
    assert sum(g["draft_tokens"] for g in rep["parts"]["greedy"]["prompts"]) > 0
    assert len(rep["parts"]["sampling"]["tests"]) == 6 and rep["parts"]["e2e"]["draft_tokens_verified"] > 0
    assert all(0 <= t["power_at_tv"] <= 1 for t in rep["parts"]["sampling"]["tests"])


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--drafter", "none"], "nothing to check"),
        (["--prompts", "{missing}/prompts.txt"], "no such file"),
        (["--alpha", "0.7"], "alpha must be in"),
        (["--samples", "5"], "samples must be"),
        (["--temperature", "0"], "temperature > 0"),
        (["--json-out", "{missing}/dir/x.json"], "--json-out"),
    ],
)
def test_check_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, fragment):
    # "{missing}" is a folder that surely does not exist (not a fixed path such as
    # /nonexistent, which anything run as root may have created)
    argv = [a.replace("{missing}", str(tmp_path / "missing")) for a in argv]
    code = main(["check", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
