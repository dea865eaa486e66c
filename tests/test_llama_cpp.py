"""llama.cpp backend on the real bundled models: numerics, caches and rollback, greedy losslessness."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FrozenCost, assert_greedy_identical, next_logits_fresh
from speculative import SpeculativeGenerator
from speculative.backends.base import ForwardRequest
from speculative.drafters import DraftModelDrafter, NgramDrafter, build_drafter
from speculative.drafters.base import NoDrafter
from speculative.numerics import check_batch_invariance
from speculative.config import SamplingParams
from speculative.sampling import Sampler

MODELS = ["smol", "gemma"]


@pytest.fixture(scope="module", params=MODELS)
def target(request):
    return request.getfixturevalue(request.param)


def prompt_ids(gen: SpeculativeGenerator, row: dict) -> list[int]:
    return gen.encode_prompt(row["turns"][0])  # chat template where the model has one


def test_batched_logits_equal_single_token_logits(target):
    rep = check_batch_invariance(target, batch_sizes=(2, 4, 8, 16))
    assert rep.identical, f"max difference {rep.max_abs_diff}"
    assert target.batch_invariant


def test_end_of_generation_sets(smol, gemma):
    assert {smol.token_text(t) for t in smol.eos_token_ids} >= {"<|im_end|>", "<|endoftext|>"}
    assert {gemma.token_text(t) for t in gemma.eos_token_ids} >= {"<eos>", "<end_of_turn>"}


def test_chat_template_from_the_model_file(smol, gemma):
    ids = smol.apply_chat_template([{"role": "user", "content": "Hi there"}])
    text = smol.decode(ids)
    assert "Hi there" in text and text.rstrip().endswith("assistant")
    assert gemma.chat_template is None  # Gemma 3 270M base has none: --chat defaults off


def _generate_then_check_caches(target, drafter, ids, max_new, k):
    gen = SpeculativeGenerator(target, drafter)
    r = gen.generate(ids, max_new_tokens=max_new, num_speculative_tokens=k, draft_policy="fixed")
    context = list(ids) + r.token_ids
    # the target's cache holds every committed token but the last, after rollbacks
    seq = 0
    assert target.cached_tokens(seq) == context[:-1]
    cached = target.forward([ForwardRequest(seq, [context[-1]], logits="last")])[0].logits[-1].copy()
    target.truncate(seq, len(context) - 1)
    fresh = next_logits_fresh(target, context)
    np.testing.assert_allclose(cached, fresh, rtol=0, atol=1e-4)
    # the draft model's cache is a prefix of the context and continues like a fresh prefill
    if isinstance(drafter, DraftModelDrafter):
        dm = drafter.model
        dcached = list(dm.cached_tokens(0))
        assert dcached == context[: len(dcached)] and len(dcached) >= len(context) - k - 2
        dlog = dm.forward([ForwardRequest(0, context[len(dcached):], logits="last")])[0].logits[-1].copy()
        np.testing.assert_allclose(dlog, next_logits_fresh(dm, context), rtol=0, atol=1e-4)
    return r


@pytest.mark.parametrize("max_new", [5, 23, 48])
def test_rollback_equals_fresh_prefill_smollm2(smol, smol_weak_path, prompts10, max_new):
    drafter = build_drafter(f"model:{smol_weak_path}", smol)
    try:
        gen = SpeculativeGenerator(smol, drafter)
        r = _generate_then_check_caches(smol, drafter, prompt_ids(gen, prompts10[0]), max_new, k=4)
        if max_new >= 23:
            assert r.stats.accept_counts[0] > 0, "no rejection happened: the test would not exercise rollback"
    finally:
        drafter.close()


def test_a_model_drafter_keeps_its_calibration_across_requests(smol, smol_weak_path, prompts10):
    """How the drafter's confidence predicts acceptance is learnt across requests (one calibration per
    drafter and tenant, scored into by each request), not afresh per request; another drafter, or another
    tenant, learns its own. With a drafting bar (min_confidence > 0: the adaptive policy's) it asks, before
    each further token, whether that token is worth drafting, for positions 1, 2, ... of its draft."""
    drafter = build_drafter(f"model:{smol_weak_path}", smol)
    other = build_drafter(f"model:{smol_weak_path}", smol)
    asked = []
    try:
        gen = SpeculativeGenerator(smol, drafter)
        cal = drafter.calibrations.get("")
        seen = []
        for row in prompts10[:2]:
            gen.generate(prompt_ids(gen, row), max_new_tokens=24, num_speculative_tokens=3, draft_policy="fixed")
            seen.append(sum(n for _, n in cal.counts.values()))
        assert 0 < seen[0] < seen[1], seen  # the second request added to what the first learnt
        st = drafter.start([1, 2, 3])
        assert st.scorer.calibration is cal
        drafter.finish(st)
        assert not other.calibrations.get("").counts
        tenant = drafter.calibrations.get("tenant-a")
        gen.generate(prompt_ids(gen, prompts10[2]), max_new_tokens=24, num_speculative_tokens=3,
                     draft_policy="fixed", tenant="tenant-a")
        assert tenant.counts and sum(n for _, n in cal.counts.values()) == seen[1]  # tenant-a's alone
        # with a drafting bar (the adaptive policy's), the drafter asks whether each further token is worth
        # drafting, at positions 1, 2, ... (here k = 3: positions 1 and 2)
        cal.worth_drafting = lambda cum, position, min_confidence: asked.append(position) or True
        ids = prompt_ids(gen, prompts10[3])
        st = drafter.start(ids)
        p = drafter.propose(st, ids, 3, Sampler(SamplingParams()), np.random.default_rng(0), min_confidence=1e-9)
        drafter.finish(st)
        assert len(p.tokens) == 3 and asked == [1, 2], asked
    finally:
        drafter.close()
        other.close()


def test_rollback_past_gemma_sliding_window(gemma, gemma_weak_path, prompts10):
    long_row = next(r for r in prompts10 if r["category"] == "summarization")
    drafter = build_drafter(f"model:{gemma_weak_path}", gemma)
    try:
        gen = SpeculativeGenerator(gemma, drafter)
        ids = prompt_ids(gen, long_row)
        assert len(ids) > 600, "needs a prompt past the 512-token window"
        r = _generate_then_check_caches(gemma, drafter, ids, 40, k=5)
        assert r.stats.accept_counts[0] > 0
    finally:
        drafter.close()


def test_greedy_identity_all_drafters(target, prompts10, request):
    """Token ids equal plain greedy decoding for n-gram and draft-model drafters, k in {1, 3, 8}."""
    name = "smollm2-135m-instruct" if target.model_id.startswith("smollm2") else "gemma-3-270m"
    weak_path = request.getfixturevalue("smol_weak_path" if name.startswith("smollm2") else "gemma_weak_path")
    drafters = {
        "ngram": NgramDrafter(1, 4),
        "weak-model": build_drafter(f"model:{weak_path}", target),
        "self-model": build_drafter(f"model:{name}", target),
    }
    totals = {d: {} for d in drafters}
    adaptive = [0, 0]  # draft tokens, accepted, over the adaptive runs
    try:
        plain_gen = SpeculativeGenerator(target, NoDrafter())
        for row in prompts10:
            ids = prompt_ids(plain_gen, row)
            target.truncate(0, 0)
            plain = plain_gen.generate(ids, max_new_tokens=40).token_ids
            for dname, d in drafters.items():
                gen = SpeculativeGenerator(target, d)
                # the adaptive runs see a flat T(n) (as on a GPU), so that the policy drafts here whatever
                # this machine's measured (or cached) T(n): what they check is then never vacuous
                flat = SpeculativeGenerator(target, d, cost_model=FrozenCost([1, 16], [0.01, 0.01]))
                for k, policy in ((1, "fixed"), (3, "fixed"), (8, "fixed"), (8, "adaptive")):
                    r = (flat if policy == "adaptive" else gen).generate(
                        ids, max_new_tokens=40, num_speculative_tokens=k, draft_policy=policy)
                    label = f"{target.model_id} q{row['question_id']} {dname} k={k} {policy}"
                    assert_greedy_identical(target, ids, plain, r.token_ids, exact=True, label=label)
                    if policy == "adaptive":
                        adaptive[0] += r.stats.draft_tokens
                        adaptive[1] += r.stats.accepted_tokens
                        continue
                    t = totals[dname].setdefault(k, [0, 0, np.zeros(k + 1, int)])
                    t[0] += r.stats.draft_tokens
                    t[1] += r.stats.accepted_tokens
                    t[2] += np.array(r.stats.accept_counts)
    finally:
        for d in drafters.values():
            d.close()
    # the target as its own draft model: every draft token accepted (exact numerics)
    for k, (drafted, accepted, _) in totals["self-model"].items():
        assert drafted > 0 and accepted == drafted, f"self-drafting acceptance {accepted}/{drafted} at k={k}"
    # the weaker drafter produced both full rejections and full acceptances
    for k in (3, 8):
        counts = totals["weak-model"][k][2]
        assert counts[0] > 0 and counts[k] > 0, f"k={k} accept counts {counts.tolist()}"
    assert totals["ngram"][3][1] > 0, "n-gram drafting never accepted a token"
    # the adaptive policy's runs were checked with drafts in them, accepted and rejected
    assert 0 < adaptive[1] < adaptive[0], f"adaptive runs: {adaptive[1]} of {adaptive[0]} draft tokens accepted"


def test_eos_accepted_mid_block(smol):
    """A step that accepts EOS before its last draft token ends the output right after EOS."""
    drafter = build_drafter("model:smollm2-135m-instruct", smol)
    try:
        ids = SpeculativeGenerator(smol, NoDrafter()).encode_prompt("Reply with exactly one word: yes or no. Is water wet?")
        plain = SpeculativeGenerator(smol, NoDrafter()).generate(ids, max_new_tokens=64)
        assert plain.finish_reason == "stop" and plain.token_ids[-1] in smol.eos_token_ids
        g = SpeculativeGenerator(smol, drafter).stream(ids, max_new_tokens=64, num_speculative_tokens=8, draft_policy="fixed")
        blocks = list(g.blocks())
        r = g.result
        assert r.token_ids == plain.token_ids and r.finish_reason == "stop"
        last = blocks[-1]
        # the last step verified more accepted tokens than it emitted: EOS was cut mid-block
        accepted_last = max(j for j, c in enumerate(r.stats.accept_counts) if c)
        assert last[-1] in smol.eos_token_ids and len(last) < accepted_last + 1
        assert r.text == plain.text and "<|im_end|>" not in r.text
    finally:
        drafter.close()


def test_max_new_tokens_is_exact_with_multi_token_steps(smol, prompts10):
    drafter = build_drafter("model:smollm2-135m-instruct", smol)
    try:
        ids = SpeculativeGenerator(smol, NoDrafter()).encode_prompt(prompts10[0]["turns"][0])
        for n in (1, 2, 7, 10):
            r = SpeculativeGenerator(smol, drafter).generate(ids, max_new_tokens=n, num_speculative_tokens=8, draft_policy="fixed")
            assert len(r.token_ids) == n and r.finish_reason == "length"
    finally:
        drafter.close()


def test_streaming_pieces_concatenate_to_text(smol, prompts10):
    gen = SpeculativeGenerator(smol, NgramDrafter())
    g = gen.stream(prompts10[1]["turns"][0], max_new_tokens=48)
    pieces = list(g)
    assert "".join(pieces) == g.result.text == smol.decode(g.result.token_ids)


def test_sampled_generation_smoke_is_reproducible(smol, smol_weak_path, prompts10):
    drafter = build_drafter(f"model:{smol_weak_path}", smol)
    try:
        gen = SpeculativeGenerator(smol, drafter)
        kw = dict(max_new_tokens=32, num_speculative_tokens=4, temperature=0.8, top_p=0.95, seed=1234, draft_policy="fixed")
        a = gen.generate(prompts10[0]["turns"][0], **kw)
        b = gen.generate(prompts10[0]["turns"][0], **kw)
        assert a.token_ids == b.token_ids and len(a.token_ids) >= 1
        assert 0 < a.stats.acceptance_rate < 1 and a.stats.draft_tokens > 0
        c = gen.generate(prompts10[0]["turns"][0], **{**kw, "seed": 99})
        assert c.token_ids != a.token_ids
    finally:
        drafter.close()


def test_tree_drafts_greedy_identity(prompts10):
    """Token trees (n-gram tree drafter) verified with per-token sequence ids equal plain greedy decoding."""
    from speculative.backends import load_backend

    for name in ("smollm2-135m-instruct", "gemma-3-270m"):
        t = load_backend(name, n_ctx=4096, tree_width=3)
        try:
            assert t.supports_tree and t.tree_spine_only
            plain_gen = SpeculativeGenerator(t, NoDrafter())
            tree_gen = SpeculativeGenerator(t, NgramDrafter(1, 4, tree=3))
            nodes = 0
            for j, row in enumerate(prompts10):
                ids = plain_gen.encode_prompt(row["turns"][0])
                plain = plain_gen.generate(ids, max_new_tokens=32).token_ids
                for k, policy in ((4, "fixed"), (8, "adaptive")):
                    r = tree_gen.generate(ids, max_new_tokens=32, num_speculative_tokens=k, draft_policy=policy)
                    label = f"{name} q{row['question_id']} ngram tree k={k} {policy}"
                    assert_greedy_identical(t, ids, plain, r.token_ids, exact=True, label=label)
                    nodes += r.stats.draft_tokens
                    if j >= 3:
                        continue
                    # the cache holds a prefix of the context and continues like a fresh prefill
                    ctx = list(ids) + r.token_ids
                    cached = list(t.cached_tokens(0))
                    assert cached == ctx[: len(cached)]
                    got = t.forward([ForwardRequest(0, ctx[len(cached):], logits="last")])[0].logits[-1].copy()
                    np.testing.assert_allclose(got, next_logits_fresh(t, ctx), rtol=0, atol=1e-4)
            assert nodes > 0
        finally:
            t.close()


def test_no_token_is_drawn_from_an_off_spine_nodes_logits(prompts10, monkeypatch):
    """Exact numerics: an off-spine node's logits are not plain decoding's (its K/V sits in another cell than its
    position's), so a path that ends at one yields no next token. Here every off-spine row is poisoned (its argmax
    a token the prompts never produce); the output must still be plain greedy decoding's, with such paths taken
    (a Qwen gate question once differed from plain decoding where a near-tie met that bonus token)."""
    from speculative import request as request_module
    from speculative.backends import load_backend
    from speculative.trees import spine

    poison = 1000
    t = load_backend("smollm2-135m-instruct", n_ctx=4096, tree_width=3)
    try:
        assert t.tree_spine_only
        forward = t.forward

        def poisoned_forward(reqs, *a, **kw):
            outs = forward(reqs, *a, **kw)
            for req, out in zip(reqs, outs):
                if req.tree_parents is None:
                    continue
                on_spine = set(spine(list(req.tree_parents)))
                for j, u in enumerate(req.output_rows()):
                    if u not in on_spine:
                        out.logits[j] = out.logits[j].min()
                        out.logits[j][poison] = 1e4
            return outs

        ended_off_spine = []
        verify = request_module.verify_tree_greedy

        def counting_verify(choice, tokens, parents):
            res = verify(choice, tokens, parents)
            ended_off_spine.append(bool(res.path) and res.path[-1] not in spine(parents))
            return res

        monkeypatch.setattr(t, "forward", poisoned_forward)
        monkeypatch.setattr(request_module, "verify_tree_greedy", counting_verify)
        plain_gen = SpeculativeGenerator(t, NoDrafter())
        tree_gen = SpeculativeGenerator(t, NgramDrafter(1, 4, tree=3))
        for row in prompts10:
            ids = plain_gen.encode_prompt(row["turns"][0])
            plain = plain_gen.generate(ids, max_new_tokens=48).token_ids
            assert poison not in plain
            r = tree_gen.generate(ids, max_new_tokens=48, num_speculative_tokens=4, draft_policy="fixed")
            assert_greedy_identical(t, ids, plain, r.token_ids, exact=True, label=f"q{row['question_id']} poisoned")
        assert sum(ended_off_spine) > 0, "no path ended at an off-spine node: the test checked nothing"
    finally:
        t.close()


def test_a_closed_model_refuses_use_instead_of_crashing():
    """After close() the model's memory is freed: generate, encode and forward raise ModelLoadError (a call
    into the freed model ended the process with a segmentation fault)."""
    from speculative import SpeculativeGenerator
    from speculative.backends.base import ForwardRequest
    from speculative.errors import ModelLoadError

    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", n_ctx=256)
    gen.close()
    with pytest.raises(ModelLoadError, match="closed"):
        gen.generate("hi", max_new_tokens=4)
    with pytest.raises(ModelLoadError, match="closed"):
        gen.target.forward([ForwardRequest(0, [1, 2], logits="all")])
    gen.close()  # twice is harmless
