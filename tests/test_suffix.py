"""Suffix decoding (drafters/suffix.py, suffix_index.py, combined.py): matching, the token tree, memory
bound, tenant isolation, the cache file, and losslessness on the real bundled model."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest
from scipy import stats

from conftest import next_logits_fresh
from test_trees import _broken  # tries siblings without taking a rejected one's mass out of p
from speculative import SpeculativeGenerator
from speculative.drafters import build_drafter, parse_drafter_spec, tree_leaves
from speculative.drafters.base import DraftProposal, Drafter
from speculative.drafters.combined import CombinedDrafter, expected_accepted
from speculative.drafters.suffix import SuffixDrafter
from speculative.drafters.suffix_index import SequenceIndex, continuation_tree
from speculative.errors import ConfigError
from speculative.config import SamplingParams
from speculative.sampling import Sampler
from speculative.verification import tree_rejection_sample


def _propose(d: SuffixDrafter, st, context, k=8):
    return d.propose(st, context, k, None, np.random.default_rng(0))


def _request(d: SuffixDrafter, prompt, output, tenant=""):
    """A whole request through the drafter: start, then finish with prompt + output."""
    st = d.start(prompt, tenant=tenant)
    d.finish(st, list(prompt) + list(output))


# ---- the index and the tree (no model) -----------------------------------------------------------------


@pytest.mark.quick
def test_longest_match_and_its_continuations():
    idx = SequenceIndex(max_pattern=16)
    idx.add([1, 2, 3, 4, 5, 9, 9])
    idx.add([7, 3, 4, 5, 6, 6])
    m = idx.match([0, 2, 3, 4, 5], depth=3)
    assert m.length == 4 and m.continuations == [[9, 9]]  # the 4-token match beats the 3-token one
    m = idx.match([8, 8, 4, 5], depth=3)
    assert m.length == 2 and sorted(m.continuations) == [[6, 6], [9, 9]]
    assert idx.match([42], depth=3).length == 0


@pytest.mark.quick
def test_continuation_tree_counts_and_min_prob():
    conts = [[1, 2, 3]] * 6 + [[1, 4]] * 3 + [[5]]
    t = continuation_tree(conts, max_nodes=10, min_prob=0.2, max_width=4)
    toks = {(t.parents[i], t.tokens[i]): i for i in range(len(t.tokens))}
    root1 = toks[(-1, 1)]
    assert t.cond_prob[root1] == pytest.approx(0.9)
    assert (-1, 5) not in toks  # seen in 1 of 10 matches: below min_prob
    assert t.tokens[t.spine()[0]] == 1 and [t.tokens[i] for i in t.spine()] == [1, 2, 3]
    assert (root1, 4) in toks and t.path_prob[toks[(root1, 4)]] == pytest.approx(0.3)
    chain = continuation_tree(conts, max_nodes=10, min_prob=0.0, max_width=1)
    assert chain.tokens == [1, 2, 3] and chain.parents == [-1, 0, 1]


@pytest.mark.quick
def test_speculation_grows_with_the_match_length():
    d = SuffixDrafter(factor=1.0, use_global=False)
    text = list(range(100, 140))
    st = d.start(text + [7] + text[:3])
    short = _propose(d, st, text + [7] + text[:3], k=32)
    long = _propose(d, st, text + [7] + text[:20], k=32)
    assert short.tokens == text[3:6]  # a 3-token match earns 3 tokens
    assert long.tokens == text[20:40]  # a 20-token match earns 20 (to the end of the earlier text)


@pytest.mark.quick
def test_earlier_requests_are_matched_per_tenant():
    d = SuffixDrafter()
    answer = list(range(500, 530))
    _request(d, [1, 2, 3], answer, tenant="alice")
    prompt = [9, 9] + answer[:5]
    mine = _propose(d, d.start(prompt, tenant="alice"), prompt)
    theirs = _propose(d, d.start(prompt, tenant="bob"), prompt)
    anonymous = _propose(d, d.start(prompt), prompt)
    assert mine.tokens == answer[5:10]
    assert theirs.tokens == [] and anonymous.tokens == []  # nothing of alice's text reaches anyone else
    assert "bob" not in d.cache.indices or len(d.cache.indices["bob"]) == 0
    off = SuffixDrafter(use_global=False)
    _request(off, [1, 2, 3], answer)
    assert _propose(off, off.start(prompt), prompt).tokens == []


@pytest.mark.quick
def test_memory_bound_is_enforced_oldest_first():
    d = SuffixDrafter(capacity=1000)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 5000, size=120).tolist() for _ in range(30)]
    for i, s in enumerate(seqs):
        _request(d, s[:20], s[20:], tenant=f"t{i % 3}")
        assert d.cache.tokens <= 1000
        assert sum(ix.tokens for ix in d.cache.indices.values()) == d.cache.tokens
    kept = d.cache.sequences()
    assert len(kept) == 1000 // 120 and [s for _, s in kept] == seqs[-len(kept):]
    # an evicted sequence is no longer matched; a kept one is
    old, new = seqs[0], seqs[-1]
    assert _propose(d, d.start(old[:30], tenant="t0"), old[:30]).tokens == []
    got = _propose(d, d.start(new[:30], tenant=f"t{29 % 3}"), new[:30]).tokens
    assert got and got == new[30:30 + len(got)]
    _request(d, [1], list(range(3000, 4500)), tenant="big")  # one request past the whole budget
    assert d.cache.tokens == 1000 and d.cache.sequences() == [("big", ([1] + list(range(3000, 4500)))[-1000:])]


@pytest.mark.quick
def test_cache_file_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "suffix.npz"
    d = SuffixDrafter(cache=path)
    d.bind(_FakeTarget("m1"))
    _request(d, [1, 2, 3], list(range(40, 60)), tenant="a")
    _request(d, [4, 5], list(range(70, 90)), tenant="b")
    d.close()
    assert path.exists() and not list(tmp_path.glob(".*tmp"))
    e = SuffixDrafter(cache=path)
    e.bind(_FakeTarget("m1"))
    assert e.cache.sequences() == [("a", [1, 2, 3] + list(range(40, 60))), ("b", [4, 5] + list(range(70, 90)))]
    with pytest.raises(ConfigError, match="another target"):
        SuffixDrafter(cache=path).bind(_FakeTarget("m2"))
    path.write_bytes(b"not a cache")
    with pytest.raises(ConfigError, match="unreadable") as ei:
        SuffixDrafter(cache=path).bind(_FakeTarget("m1"))
    assert "\n" not in str(ei.value)


@pytest.mark.quick
def test_spec_parsing_and_errors():
    s = parse_drafter_spec("suffix,tree=4,max=16")
    assert s.kind == "suffix" and s.options == {"tree": "4", "max": "16"} and s.other is None
    c = parse_drafter_spec("suffix,tree=2+model:smollm2-135m-instruct,threads=1")
    assert c.other.kind == "model" and c.other.options == {"threads": "1"} and str(c) == (
        "suffix,tree=2+model:smollm2-135m-instruct,threads=1")
    assert tree_leaves(c) == 4 and tree_leaves("suffix") == 0
    assert parse_drafter_spec("suffix,cache=/tmp/a+b.npz").options == {"cache": "/tmp/a+b.npz"}  # a '+' in a path
    assert parse_drafter_spec("suffix,cache=/tmp/a+b.npz+ngram").other.kind == "ngram"
    with pytest.raises(ConfigError, match="names no drafter after"):
        parse_drafter_spec("suffix+")
    for bad in ("ngram+suffix", "suffix+suffix", "suffix+none", "suffix,bogus=1", "suffix:name"):
        with pytest.raises(ConfigError):
            parse_drafter_spec(bad)
    for bad in ("suffix,global=maybe", "suffix,factor=x", "suffix,min_prob=1.5"):
        with pytest.raises(ConfigError):
            build_drafter(bad, _FakeTarget("m"))
    with pytest.raises(ConfigError, match="factor=0 must be > 0"):
        build_drafter("suffix,factor=0", _FakeTarget("m"))


class _FakeTarget:
    name = "llama.cpp"
    vocab_size = 1000

    def __init__(self, model_id):
        self.model_id = model_id


class _ScriptedDrafter(Drafter):
    """Proposes a fixed chain; counts its proposals."""

    kind = "scripted"

    def __init__(self, tokens):
        super().__init__()
        self.tokens, self.calls = tokens, 0

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None):
        self.calls += 1
        toks = list(self.tokens[:max_tokens])
        return DraftProposal(tokens=toks, confidence=[0.5] * len(toks))


@pytest.mark.quick
def test_combined_takes_a_confident_suffix_match_and_the_other_drafter_elsewhere():
    assert expected_accepted([1.0, 0.5, 0.5]) == pytest.approx(1.0 + 0.5 + 0.25)
    other = _ScriptedDrafter([7, 7])
    d = CombinedDrafter(SuffixDrafter(use_global=False), other)
    text = list(range(100, 160))
    st = d.start(text)
    p = d.propose(st, text + text[:30], 8, None, np.random.default_rng(0))  # a 30-token match
    assert p.source == "suffix" and p.tokens == text[30:38] and other.calls == 0
    q = d.propose(st, [1, 2, 3], 8, None, np.random.default_rng(0))  # nothing matches
    assert q.source == "scripted" and q.tokens == [7, 7] and other.calls == 1
    assert st.chosen == {"suffix": 1, "scripted": 1}


# ---- the real model: lossless ---------------------------------------------------------------------------


def _agentic(n: int) -> list[dict]:
    with resources.files("speculative.data").joinpath("agentic.jsonl").open() as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["category"] in ("code_edit", "rewrite")][:n]


@pytest.fixture(scope="module")
def smol_tree():
    """SmolLM2 with room for token trees of up to 8 leaves."""
    from speculative.backends import load_backend

    b = load_backend("smollm2-135m-instruct", n_ctx=4096, tree_width=8)
    yield b
    b.close()


@pytest.fixture(scope="module")
def smol_plain(smol_tree):
    smol = smol_tree
    gen = SpeculativeGenerator(smol)
    rows = _agentic(2)
    prompts = [gen.encode_prompt(r["turns"][0]) for r in rows]
    plain = [gen.generate(p, max_new_tokens=96).token_ids for p in prompts]
    return prompts, plain


@pytest.mark.parametrize("spec", ["suffix", "suffix,tree=4", "suffix,tree=2+ngram"])
def test_greedy_identity_on_real_prompts(smol_tree, smol_plain, spec):
    """Greedy output with suffix drafts verified under the fixed policy is plain greedy output, token for
    token (batch-invariant backend), the second request drafting from the first one's memory too."""
    prompts, plain = smol_plain
    smol = smol_tree
    gen = SpeculativeGenerator(smol, build_drafter(spec, smol))
    try:
        total_drafted = total_accepted = 0
        for rounds in range(2):  # the second round finds the first one's answers in memory
            for p, ref in zip(prompts, plain):
                r = gen.generate(p, max_new_tokens=96, num_speculative_tokens=8, draft_policy="fixed")
                assert r.token_ids == ref, f"{spec}: outputs diverge"
                total_drafted += r.stats.draft_tokens
                total_accepted += r.stats.accepted_tokens
                if rounds == 1:
                    assert r.stats.mean_accepted_tokens > 3, "the remembered answer was not drafted"
        assert 0 < total_accepted < total_drafted, "drafts must be verified: some accepted, some rejected"
        if "+" in spec:
            assert set(gen.drafter.suffix.cache.indices) == {""}
    finally:
        gen.drafter.close()


def test_earlier_requests_do_not_change_the_output(smol_tree, smol_plain):
    """The same request after 0 and after many others gives identical tokens (greedy)."""
    prompts, plain = smol_plain
    smol = smol_tree
    gen = SpeculativeGenerator(smol, build_drafter("suffix,tree=3", smol))
    try:
        first = gen.generate(prompts[0], max_new_tokens=96, num_speculative_tokens=8, draft_policy="fixed")
        rng = np.random.default_rng(5)
        for _ in range(100):  # other requests: random token soup and the other prompt's answer
            junk = rng.integers(0, smol.vocab_size, size=60).tolist()
            st = gen.drafter.start(junk)
            gen.drafter.finish(st, junk + plain[0][:40] + junk[:10])
        again = gen.generate(prompts[0], max_new_tokens=96, num_speculative_tokens=8, draft_policy="fixed")
        assert first.token_ids == again.token_ids == plain[0]
        assert again.stats.draft_tokens > 0
    finally:
        gen.drafter.close()


def test_draft_policy_is_kept_per_tenant(smol_tree):
    """Whether and how much a drafter drafts for a tenant rests on that tenant's requests only (what it costs on
    this machine is shared)."""
    gen = SpeculativeGenerator(smol_tree, build_drafter("suffix", smol_tree))
    try:
        a, b = gen.policy_for("a"), gen.policy_for("b")
        assert a is not b and a is not gen.policy and gen.policy_for("a") is a and gen.policy_for("") is gen.policy
        ids = gen.encode_prompt("Copy this line three times: the quick brown fox jumps over the lazy dog.")
        gen.generate(ids, max_new_tokens=40, tenant="a", draft_policy="fixed")
        assert a.accepts + a.rejects > 0  # a's request drafted
        for other in (b, gen.policy):  # nothing of a's request reached another tenant's policy
            assert other.accepts == other.rejects == 0 and other.saving is None
    finally:
        gen.drafter.close()
    # a drafter that forgets each request has a policy per tenant too: a tenant's acceptance rests on its text
    ngram = SpeculativeGenerator(smol_tree, build_drafter("ngram", smol_tree))
    assert ngram.policy_for("a") is not ngram.policy_for("b") and ngram.policy_for("") is ngram.policy
    assert ngram.policy_for("a").timings is ngram.policy.timings  # the machine's measurements are shared
    ngram.policy_for("b").catchup_rate = 0.25
    assert ngram.policy_for("a").catchup_rate == 0.25
    plain = SpeculativeGenerator(smol_tree, None)
    assert plain.policy_for("a") is plain.policy  # plain decoding has no policy to keep apart


# ---- sampling through the tree path ---------------------------------------------------------------------

N_SAMPLES = 20000


@pytest.fixture(scope="module")
def real_tree(smol):
    """A suffix-drafter token tree with several first candidates on a real prompt, and the real target's
    temperature-1 distributions at its root and after each root child."""
    d = SuffixDrafter(tree=4, min_prob=0.05, factor=4.0)
    prompt = smol.encode("The weather today is")
    for cont in (" sunny and warm", " cold and wet", " mild with clouds", " sunny with wind"):
        _request(d, prompt, smol.encode(cont))
    st = d.start(prompt)
    prop = d.propose(st, prompt, 3, None, np.random.default_rng(0))
    roots = [i for i, p in enumerate(prop.parents) if p == -1]
    assert len(roots) >= 3, prop
    sampler = Sampler(SamplingParams(temperature=1.0))
    p_root = sampler.probs(next_logits_fresh(smol, prompt))
    p_node = {i: sampler.probs(next_logits_fresh(smol, prompt + _path(prop, i))) for i in range(len(prop.tokens))}
    return prop, p_root, p_node


def _path(prop, i):
    out = []
    while i >= 0:
        out.append(prop.tokens[i])
        i = prop.parents[i]
    return out[::-1]


def _first_token_pvalue(prop, p_root, p_node, verifier):
    rng = np.random.default_rng(3)
    counts: dict[int, int] = {}
    for _ in range(N_SAMPLES):
        res = verifier(lambda u: p_root if u == -1 else p_node[u], prop.tokens, prop.parents, None, rng)
        first = prop.tokens[res.path[0]] if res.path else res.next_token
        counts[first] = counts.get(first, 0) + 1
    # cells: each root candidate, the 30 most likely other tokens, and the rest pooled
    cells = [prop.tokens[i] for i, p in enumerate(prop.parents) if p == -1]
    cells += [int(t) for t in np.argsort(-p_root) if int(t) not in cells][:30]
    obs = [counts.get(t, 0) for t in cells] + [N_SAMPLES - sum(counts.get(t, 0) for t in cells)]
    exp = [p_root[t] * N_SAMPLES for t in cells] + [(1 - p_root[cells].sum()) * N_SAMPLES]
    return stats.chisquare(obs, np.asarray(exp) * sum(obs) / sum(exp)).pvalue


def test_sampling_through_the_suffix_tree_is_lossless(real_tree):
    prop, p_root, p_node = real_tree
    assert _first_token_pvalue(prop, p_root, p_node, tree_rejection_sample) > 1e-3


def test_the_sampling_test_catches_a_broken_tree_verifier(real_tree):
    prop, p_root, p_node = real_tree
    assert _first_token_pvalue(prop, p_root, p_node, _broken) < 1e-6


@pytest.mark.quick
def test_server_tenant_is_the_api_key_and_user():
    from speculative.config import GenerationConfig
    from speculative.server.protocol import ChatCompletionRequest

    def tenant(api_key="", **kw):
        body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)
        return body.generation_config(GenerationConfig(), 8, None, api_key=api_key).tenant

    assert tenant() == ""
    assert tenant(user="ana") != tenant(user="bo") != tenant()
    assert tenant("key-1", user="ana") != tenant("key-2", user="ana") != tenant(user="ana")
    assert tenant("key-1") == tenant("key-1") and "key-1" not in tenant("key-1")  # only a hash is kept


def test_cli_cache_file_carries_earlier_runs(tmp_path, capsys):
    """`--drafter suffix,cache=PATH`: a second CLI run drafts from the first one's answer (same output);
    an unwritable cache path is a one-line error."""
    from speculative.cli import main

    cache = tmp_path / "sfx.npz"
    argv = ["generate", "List the planets of the solar system, one per line.", "--max-new-tokens", "48", "--json",
            "--drafter", f"suffix,cache={cache}", "--k", "8", "--draft-policy", "fixed"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert cache.is_file()
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["token_ids"] == first["token_ids"]
    assert second["stats"]["steps"] < first["stats"]["steps"] / 2  # the remembered answer is drafted whole
    bad = ["generate", "Hi", "--max-new-tokens", "4", "--drafter", f"suffix,cache={tmp_path}/f/x.npz"]
    (tmp_path / "f").write_text("a file, not a folder")
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "suffix cache" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
