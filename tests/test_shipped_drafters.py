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
    # budget: the small targets' drafters (~14 MiB) and one head for the Qwen target (int8, ~26 MiB)
    assert total <= 48 * 2**20, f"shipped drafters take {total / 2**20:.1f} MiB (budget 48 MiB)"
    for n in SHIPPED:
        m = _meta(n)
        if m["method"] == "draft-model":  # at most 10% of the target's non-embedding parameters
            assert m["non_embedding_parameters"] <= 0.10 * 106.2e6
        else:
            assert 0 < len(m["vocab_ids"]) <= 16384 + 8  # reduced draft vocabulary (FR-Spec)


@pytest.mark.parametrize("name", [n for n in SHIPPED if not _meta(n)["target"].startswith("qwen")])  # Qwen: test_qwen_head
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
        for _ in range(20):  # a sure loss: 20 drafted steps that each lost 10 ms
            policy.observe_saving(-0.01, 1, 0.030)
        policy.measure_net, policy.silent_s = -1e9, 0.0
        assert policy.silenced
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


def test_eagle_head_precision_follows_its_drafter_json_and_int8_runs():
    """A head runs as its drafter.json recommends (``extra.inference_precision``; fp32 if absent), or as
    asked. int8 (PyTorch's dynamically quantized Linear) is recommended only where measured harmless:
    the Qwen head (teacher-forced top-1 0.42 against 0.45 in fp32 on development answers); on the
    SmolLM2 head, whose hidden states have larger outliers, int8 and fp32 agree on only a third of the
    top-1 predictions, so it stays fp32. Either way verification decides what is emitted."""
    import numpy as np
    import torch

    from speculative.drafters.head_nets import HeadCache
    from speculative.drafters.heads import EagleDrafter

    qlinear = torch.ao.nn.quantized.dynamic.Linear
    name = "smollm2-135m-instruct-eagle"
    assert "inference_precision" not in _meta(name).get("extra", {})
    d32, d8 = EagleDrafter(ROOT / name), EagleDrafter(ROOT / name, precision="int8")
    assert not d32.int8 and not any(isinstance(m, qlinear) for m in d32.head.modules())
    assert d8.int8 and any(isinstance(m, qlinear) for m in d8.head.modules())
    # the label names what runs: precision and draft-vocabulary size, as drafter options (a valid spec)
    n = len(_meta(name)["vocab_ids"])
    assert d32.description == f"eagle:{name},precision=fp32,vocab={n}"
    assert EagleDrafter(ROOT / name, tree=3, precision="int8", draft_vocab=300).description == \
        f"eagle:{name},precision=int8,vocab=300,tree=3"
    # int8 layers keep their weights packed outside parameters(): still counted (the bench's size table)
    assert d8.non_embedding_parameters() == d32.non_embedding_parameters() > 1e6
    if "qwen2.5-coder-1.5b-instruct-eagle" in SHIPPED:
        qwen = _meta("qwen2.5-coder-1.5b-instruct-eagle")
        assert qwen["extra"]["inference_precision"] == "int8"
        # and its 8,192 most frequent draft tokens (the same tau on the development prompts as all 16,387, a
        # sixth less drafting time: docs/training.md); vocab=N overrides it
        assert qwen["extra"]["draft_vocab"] == 8192
        assert EagleDrafter(ROOT / "qwen2.5-coder-1.5b-instruct-eagle").vocab_ids.tolist() == qwen["vocab_ids"][:8192]
        full = EagleDrafter(ROOT / "qwen2.5-coder-1.5b-instruct-eagle", draft_vocab=len(qwen["vocab_ids"]))
        assert full.vocab_ids.tolist() == qwen["vocab_ids"]
    # the int8 head runs (a random LM-head matrix stands in for the target's rows)
    H = d8.cfg.hidden_size
    lm = torch.nn.Linear(H, len(d8.vocab_ids), bias=False)
    from speculative.drafters.heads import int8_linears

    d8._lm_head = int8_linears(torch.nn.Sequential(lm))
    with torch.inference_mode():
        out = d8.head.step(torch.randn(5, H), torch.randn(5, H), HeadCache())
        lg = d8._logits(out)
        one = d8._logits(out[-1])
    assert lg.shape == (5, len(d8.vocab_ids)) and one.shape == (len(d8.vocab_ids),)
    # a single row is a batch of one (activations are quantized per call, so rows of a bigger batch may differ)
    assert bool(torch.isfinite(lg).all()) and np.array_equal(one.numpy(), d8._logits(out[-1:])[0].numpy())
    with pytest.raises(Exception, match="precision"):
        EagleDrafter(ROOT / name, precision="fp16")


def test_head_precision_option_overrides_the_recommendation():
    """``eagle:NAME,precision=int8|fp32|auto`` reaches the drafter; other values and heads without int8 refuse it."""
    from speculative.drafters import _precision_option, parse_drafter_spec
    from speculative.errors import ConfigError

    name = "smollm2-135m-instruct-eagle"
    assert _precision_option(parse_drafter_spec(f"eagle:{name}")) is None  # auto: drafter.json's recommendation
    assert _precision_option(parse_drafter_spec(f"eagle:{name},precision=AUTO")) is None
    assert _precision_option(parse_drafter_spec(f"eagle3:x,precision=int8")) == "int8"
    with pytest.raises(ConfigError, match="precision=fp16 must be one of auto, int8, fp32"):
        _precision_option(parse_drafter_spec(f"eagle:{name},precision=fp16"))
    with pytest.raises(ConfigError, match="unknown option 'precision' for drafter 'medusa'"):
        parse_drafter_spec("medusa:x,precision=int8")
    for spec, int8 in ((f"eagle:{name},precision=int8", True), (f"eagle:{name}", False)):
        gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=spec, n_ctx=256)
        try:
            assert gen.drafter.int8 is int8
        finally:
            gen.close()


@pytest.mark.quick
def test_auto_drafter_is_the_targets_recommended_one_when_shipped(monkeypatch):
    import dataclasses

    from speculative.drafters import default_drafter
    from speculative.models import REGISTRY

    smol = REGISTRY["smollm2-135m-instruct"]
    assert default_drafter("no-such-target.gguf") == "ngram"
    monkeypatch.setitem(REGISTRY, "smollm2-135m-instruct",
                        dataclasses.replace(smol, drafter="suffix+eagle:smollm2-135m-instruct-eagle,tree=2"))
    assert default_drafter("smollm2-135m-instruct") == "suffix+eagle:smollm2-135m-instruct-eagle,tree=2"
    monkeypatch.setitem(REGISTRY, "smollm2-135m-instruct", dataclasses.replace(smol, drafter="eagle:not-shipped"))
    assert default_drafter("smollm2-135m-instruct") == "ngram"  # a recommended drafter that is not installed


@pytest.mark.quick
def test_resolve_drafter_is_the_one_place_auto_is_resolved():
    from speculative.drafters import default_drafter, resolve_drafter

    target = "smollm2-135m-instruct"
    assert resolve_drafter(target, "auto") == default_drafter(target)
    assert resolve_drafter(target, None) == "none"
    assert resolve_drafter(target, "ngram:n=3") == "ngram:n=3"
    assert resolve_drafter("no-such-target.gguf", "auto") == "ngram"


@pytest.mark.parametrize("damage,words", [
    ("array", "a JSON object was expected"),
    ("extra-list", "'extra' must be an object"),
    ("vocab-beyond", "beyond the target's 49,152 tokens"),
    ("vocab-beyond-unrecorded", "its draft vocabulary holds token 60,000"),
    ("hidden-text", "'hidden_size' must hold integers >= 1"),
    ("precision", "'extra.inference_precision' must be \"int8\" or \"fp32\", got \"fp16\""),
    ("draft-vocab", "'extra.draft_vocab' must be an integer >= 1, got 0"),
])
def test_hand_damaged_drafter_json_is_one_line_naming_the_file(tmp_path, capsys, damage, words):
    """A drafter.json edited into nonsense is refused before any work, with one line that names it."""
    import shutil

    from speculative.cli import main

    bad = tmp_path / "bad-head"
    shutil.copytree(ROOT / "smollm2-135m-instruct-eagle", bad)
    meta = _meta("smollm2-135m-instruct-eagle")
    if damage == "array":
        meta = [meta]
    elif damage == "extra-list":
        meta["extra"] = [1, 2]
    elif damage.startswith("vocab-beyond"):
        meta["vocab_ids"] = meta["vocab_ids"][:-1] + [60_000]
        if damage.endswith("unrecorded"):
            meta["target_vocab_size"] = 0  # imported heads may not record it: the target's own size decides
    elif damage == "hidden-text":
        meta["hidden_size"] = "big"
    elif damage == "draft-vocab":
        meta["extra"] = {"draft_vocab": 0}
    else:
        meta["extra"] = {"inference_precision": "fp16"}
    (bad / "drafter.json").write_text(json.dumps(meta))
    rc = main(["generate", "--target", "smollm2-135m-instruct", "--drafter", f"eagle:{bad}", "--max-new-tokens", "4",
               "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and str(bad / "drafter.json") in err[0] and words in err[0], err


@pytest.mark.parametrize("threads", [1, 2])
def test_head_drafts_on_as_many_pytorch_threads_as_the_target_uses(threads):
    import os

    if threads > (os.cpu_count() or 1):
        pytest.skip("one CPU: the target takes at most one thread")
    """A head's PyTorch work follows the target's thread count (here fixed by n_threads): on a busy machine the
    governor's drop to one thread then reaches the head too (docs/policy.md, "Threads")."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3 - threads)  # the other count, so that following it is seen
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="eagle:smollm2-135m-instruct-eagle",
                                               n_ctx=256, n_threads=threads)
    try:
        assert gen.target.cpu_threads_now() == threads
        r = gen.generate("Name three colors.", max_new_tokens=8, num_speculative_tokens=2, draft_policy="fixed")
        assert r.stats.draft_tokens > 0 and torch.get_num_threads() == threads
    finally:
        gen.close()
    try:
        assert torch.get_num_threads() == 3 - threads  # close() gives the process its count back
    finally:
        torch.set_num_threads(before)


def test_head_vocab_option_keeps_the_most_frequent_draft_tokens():
    """``eagle:NAME,vocab=N``: the first N ids of drafter.json's vocab_ids (most frequent first), and only their
    LM-head rows are read; drafting stays lossless (verification decides), greedy output is plain decoding's."""
    from speculative.drafters import parse_drafter_spec
    from speculative.errors import ConfigError

    name = "smollm2-135m-instruct-eagle"
    ids = _meta(name)["vocab_ids"]
    prompt = "Write a short poem about the sea."
    plain = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="none", n_ctx=512)
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=f"eagle:{name},vocab=300", n_ctx=512)
    try:
        d = gen.drafter
        assert d.vocab_ids.tolist() == ids[:300] and tuple(d.weights.lm_head.shape) == (300, gen.target.hidden_size)
        r = gen.generate(prompt, max_new_tokens=48, num_speculative_tokens=3, draft_policy="fixed")
        assert r.stats.draft_tokens > 0 and r.stats.accepted_tokens > 0
        assert set(r.token_ids) - set(ids[:300])  # tokens outside the draft vocabulary still come out
        assert r.token_ids == plain.generate(prompt, max_new_tokens=48).token_ids
    finally:
        gen.close()
        plain.close()
    with pytest.raises(ConfigError, match="vocab=0 must be >= 1"):
        SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=f"eagle:{name},vocab=0", n_ctx=256)
    with pytest.raises(ConfigError, match="unknown option 'vocab' for drafter 'eagle3'"):
        parse_drafter_spec("eagle3:x,vocab=10")


def test_draft_vocab_recommendation_is_for_eagle_heads_only(tmp_path):
    """extra.draft_vocab in a Medusa head's drafter.json is refused naming the file (its LM heads may be its own)."""
    import shutil

    from speculative.drafters.heads import MedusaDrafter
    from speculative.errors import ConfigError

    bad = tmp_path / "medusa"
    shutil.copytree(ROOT / "smollm2-135m-instruct-medusa", bad)
    meta = _meta("smollm2-135m-instruct-medusa")
    meta["extra"] = {"draft_vocab": 100}
    (bad / "drafter.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=f"{bad / 'drafter.json'}: a draft vocabulary size .* EAGLE heads only"):
        MedusaDrafter(bad)


@pytest.mark.parametrize("spec", ["eagle:smollm2-135m-instruct-eagle", "medusa:smollm2-135m-instruct-medusa",
                                  "suffix+eagle:smollm2-135m-instruct-eagle"])
def test_a_head_is_warmed_up_at_load_and_leaves_no_trace(spec, monkeypatch):
    """Loading a head runs one proposal on made-up features (:meth:`~speculative.drafters.base.Drafter.warm_up`),
    on the target's thread count, so that what a first PyTorch call costs once per process is not timed in the
    first request (docs/policy.md, "Warm-up"), and once only. It leaves no calibration or request state; the
    first request then drafts and decodes as plain decoding."""
    import torch

    from speculative.drafters import heads

    calls = []
    propose = heads._HeadDrafter.propose

    def spy(self, state, context, *a, **kw):
        out = propose(self, state, context, *a, **kw)
        calls.append((len(context), torch.get_num_threads()))  # the count the proposal ran on
        return out

    monkeypatch.setattr(heads._HeadDrafter, "propose", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not the target's count, so that following it is seen
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=spec, n_ctx=512, n_threads=1)
    try:
        head = getattr(gen.drafter, "other", gen.drafter)
        assert len(calls) == 1 and calls[0] == (max(1, head.hidden_window) + 1, 1), calls
        assert not head.calibrations._by_tenant  # no tenant's calibration was made or touched
        gen.drafter.warm_up()  # once per drafter: a second call (a combined drafter's) runs nothing
        assert len(calls) == 1
        plain = SpeculativeGenerator(gen.target, NoDrafter())
        ids = gen.encode_prompt("Write a Python function that returns the sum of a list.")
        want = plain.generate(ids, max_new_tokens=24).token_ids
        r = gen.generate(ids, max_new_tokens=24, num_speculative_tokens=3, draft_policy="fixed")
        assert r.token_ids == want and r.stats.draft_tokens > 0 and len(calls) > 1
    finally:
        gen.close()
        torch.set_num_threads(before)
