"""The drafters this project trained and ships (``src/speculative/data/drafters``): they load by name,
stay within the size budget, and decode token-identically to plain greedy decoding on both backends,
as chains and as token trees."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from conftest import assert_greedy_identical, resume_with
from speculative import SpeculativeGenerator
from speculative.drafters import shipped_drafters
from speculative.drafters.base import NoDrafter

ROOT = Path(str(resources.files("speculative") / "data" / "drafters"))
SHIPPED = shipped_drafters()
SPEC = {"eagle": "eagle", "medusa": "medusa", "draft-model": "model"}


def _meta(name: str) -> dict:
    return json.loads((ROOT / name / "drafter.json").read_text())


def test_every_bundled_target_has_a_shipped_drafter_within_the_size_budget():
    targets = {_meta(n)["target"] for n in SHIPPED}
    assert {"smollm2-135m-instruct", "gemma-3-270m"} <= targets, SHIPPED
    total = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    assert total <= 20 * 2**20, f"shipped drafters take {total / 2**20:.1f} MiB (budget 20 MiB)"
    for n in SHIPPED:
        m = _meta(n)
        if m["method"] == "draft-model":  # at most 10% of the target's non-embedding parameters
            assert m["non_embedding_parameters"] <= 0.10 * 106.2e6
        else:
            assert 0 < len(m["vocab_ids"]) <= 16384 + 8  # reduced draft vocabulary (FR-Spec)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_drafter_greedy_identity_llama_cpp(name, prompts10):
    """Chain (k = 4 fixed, k = 8 adaptive) and, for heads, token trees: identical to plain greedy."""
    meta = _meta(name)
    spec = f"{SPEC[meta['method']]}:{name}"
    variants = [spec] + ([f"{spec},tree=3"] if meta["method"] != "draft-model" else [])
    for v in variants:
        gen = SpeculativeGenerator.from_pretrained(meta["target"], drafter=v, n_ctx=2048)
        try:
            plain_gen = SpeculativeGenerator(gen.target, NoDrafter())
            accepted = 0
            for row in prompts10[:3]:
                ids = gen.encode_prompt(row["turns"][0])
                plain = plain_gen.generate(ids, max_new_tokens=32).token_ids
                for k, policy in ((4, "fixed"), (8, "adaptive")):
                    r = gen.generate(ids, max_new_tokens=32, num_speculative_tokens=k, draft_policy=policy)
                    assert_greedy_identical(gen.target, ids, plain, r.token_ids, exact=True,
                                            label=f"{v} q{row['question_id']} k={k} {policy}")
                    accepted += r.stats.accepted_tokens
            assert accepted > 0, f"{v}: no draft token was ever accepted"
        finally:
            gen.close()


def test_shipped_eagle_tree_greedy_identity_transformers(prompts10):
    """The SmolLM2 EAGLE head on the transformers backend, whole token trees verified with a tree mask."""
    name = "smollm2-135m-instruct-eagle"
    if name not in SHIPPED:
        pytest.fail(f"{name} is not shipped")
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=f"eagle:{name},tree=3",
                                               backend="transformers", n_ctx=2048)
    try:
        plain_gen = SpeculativeGenerator(gen.target, NoDrafter())
        ties: list = []
        nodes = 0
        for row in prompts10[:3]:
            ids = gen.encode_prompt(row["turns"][0])
            plain = plain_gen.generate(ids, max_new_tokens=32).token_ids
            kw = dict(num_speculative_tokens=4, draft_policy="fixed")
            r = gen.generate(ids, max_new_tokens=32, **kw)
            assert_greedy_identical(gen.target, ids, plain, r.token_ids, exact=False, ties=ties,
                                    label=f"transformers eagle tree q{row['question_id']}", resume=resume_with(gen, ids, **kw))
            nodes += r.stats.draft_tokens
        assert nodes > 0
    finally:
        gen.close()


def test_a_silenced_head_costs_nothing_in_a_request(prompts10, monkeypatch):
    """A head drafter silenced by a negative measured saving decodes the request plainly: no hidden
    states asked of the target, no drafter state, no proposal; output as plain decoding. The next
    request that re-measures it (budget spent) drafts again, with hidden states."""
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="eagle:smollm2-135m-instruct-eagle",
                                               n_ctx=2048)
    try:
        d, target = gen.drafter, gen.target
        plain = SpeculativeGenerator(target, NoDrafter())
        ids = gen.encode_prompt(prompts10[0]["turns"][0])
        want = plain.generate(ids, max_new_tokens=24).token_ids
        seen = {"hidden": 0, "propose": 0, "start": 0}
        fwd, prop, start = target.forward, d.propose, d.start

        def spy_forward(reqs):
            seen["hidden"] += sum(bool(r.hidden) for r in reqs)
            return fwd(reqs)

        def spy_propose(*a, **kw):
            seen["propose"] += 1
            return prop(*a, **kw)

        def spy_start(*a, **kw):
            seen["start"] += 1
            return start(*a, **kw)

        monkeypatch.setattr(target, "forward", spy_forward)
        monkeypatch.setattr(d, "propose", spy_propose)
        monkeypatch.setattr(d, "start", spy_start)
        # silenced, with a re-measure far away: a large loss, no time sat out yet
        policy = gen.policy
        policy.saving, policy.measure_net, policy.silent_s = -0.01, -1e9, 0.0
        r = gen.generate(ids, max_new_tokens=24, num_speculative_tokens=4)
        assert r.token_ids == want and r.stats.draft_tokens == 0
        assert seen == {"hidden": 0, "propose": 0, "start": 0}, seen
        # the budget is spent: this request measures afresh, with hidden states and proposals
        policy.measure_net, policy.silent_s = -0.01, 100.0
        r = gen.generate(ids, max_new_tokens=24, num_speculative_tokens=4, draft_policy="adaptive")
        assert r.token_ids == want
        assert seen["hidden"] > 0 and seen["start"] == 1 and seen["propose"] > 0, seen
    finally:
        gen.close()
