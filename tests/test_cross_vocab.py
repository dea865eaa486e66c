"""Draft models with another tokenizer than the target's (``model:NAME`` across vocabularies).

* vocabulary comparison by token strings and special ids; ``vocab=same`` forced on a
  mismatched pair, an unknown mode, and pairs that cannot be bridged: clear errors;
* re-tokenization edge cases on the real tokenizers (SmolLM2: byte-level BPE, 49,152
  tokens; Gemma 3: SentencePiece with byte fallback, 262,144 tokens): leading and
  repeated spaces, newlines and tabs, digits, non-ASCII text, emoji, a word one
  tokenizer merges and the other splits, a boundary inside a committed token, a
  special token in the prompt, text ending inside a multi-byte character;
* greedy identity against plain greedy decoding (fixed policy, so drafts are really
  verified) for SmolLM2-135M -> Gemma-3-270M and Gemma-3-270M -> SmolLM2-135M, text
  bridge and token intersection, and for SmolLM2/Gemma -> Qwen2.5-Coder-1.5B when that
  model is installed, asserting that drafts were both accepted and rejected;
* the drafter's KV cache: rolled back, never re-prefilled, and equal to a fresh prefill;
* token-level intersection (TLI) under sampling, verification step alone on real
  distributions: the emitted token follows the target's p (chi-square), and the
  deliberately wrong variant (the unrestricted drafter distribution as q) is caught.

Prompts are at most 200 tokens and generations at most 32 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import next_logits_fresh, spec_bench_prompts
from scipy import stats
from test_sampling_real import _pvalue

from speculative.backends.base import Backend
from speculative.config import SamplingParams
from speculative.drafters import build_drafter
from speculative.drafters.base import NoDrafter
from speculative.drafters.cross_vocab import CrossVocabDrafter, CrossVocabState
from speculative.drafters.token_bridge import TokenTable, compare_vocabularies, retokenize, utf8_complete_len
from speculative.engine import SpeculativeGenerator
from speculative.errors import ConfigError, ModelLoadError, ModelNotFoundError, VocabularyMismatchError
from speculative.sampling import Sampler, sample_from
from speculative.verification import rejection_sample

SMOL = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m"
QWEN = "qwen2.5-coder-1.5b-instruct"
CODE_PROMPTS = [
    "Write a Python function `is_palindrome(s)` that ignores case and punctuation, with two examples.",
    "Explain what this code does:\n\nfor i in range(3):\n\tprint(i * 2)\n",
]


@pytest.fixture(scope="module")
def tables(smol, gemma):
    return {"smol": TokenTable(smol), "gemma": TokenTable(gemma)}


def _prompts() -> list[str]:
    rows = spec_bench_prompts({"writing": 1, "translation": 1, "qa": 1, "math_reasoning": 1})
    return [r["turns"][0] for r in rows] + CODE_PROMPTS


# ---- vocabularies and errors -----------------------------------------------------------------


def test_vocabularies_compared_by_token_strings(smol, gemma):
    assert compare_vocabularies(smol, smol).same
    cmp = compare_vocabularies(gemma, smol)
    assert not cmp.same and "token 0" in cmp.reason


def test_vocabulary_comparison_checks_special_ids_and_every_string(smol):
    from types import SimpleNamespace

    def like_smol(**kw):
        base = {"vocab_size": smol.vocab_size, "token_text": smol.token_text, "bos_token_id": smol.bos_token_id,
                "eos_token_ids": smol.eos_token_ids, "model_id": "variant"}
        return SimpleNamespace(**{**base, **kw})

    assert compare_vocabularies(smol, like_smol()).same
    assert "BOS" in compare_vocabularies(smol, like_smol(bos_token_id=0)).reason
    assert "end-of-generation" in compare_vocabularies(smol, like_smol(eos_token_ids=frozenset({2}))).reason
    last = smol.vocab_size - 1  # one string differs, at the very end: no sample would catch it
    renamed = like_smol(token_text=lambda i: "x" if i == last else smol.token_text(i))
    assert f"token {last}" in compare_vocabularies(smol, renamed).reason
    assert "tokens" in compare_vocabularies(smol, like_smol(vocab_size=smol.vocab_size - 1)).reason


def test_forcing_same_vocabulary_on_another_tokenizer_is_a_clear_error(gemma):
    with pytest.raises(VocabularyMismatchError, match="vocab=same.*another tokenizer.*token 0"):
        build_drafter(f"model:{SMOL},vocab=same,threads=1", gemma)
    with pytest.raises(ConfigError, match="vocab=bogus must be one of"):
        build_drafter(f"model:{SMOL},vocab=bogus,threads=1", gemma)


def test_cli_same_vocabulary_forced_exits_2_with_one_line(capsys):
    from speculative.cli import main

    rc = main(["generate", "Hi", "--target", GEMMA, "--drafter", f"model:{SMOL},vocab=same", "--max-new-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "vocab=same" in err


class _Unbridgeable(Backend):
    """A model whose tokenizer lowercases text (no byte-exact round trip) over a tiny vocabulary
    that shares no string with real ones: neither bridge can work."""

    name = "fake"
    model_id = "lowercasing-toy"

    def __init__(self):
        super().__init__()
        self.vocab_size = 40
        self.n_ctx = 64
        self._init_sequences()

    def _forward(self, requests):  # pragma: no cover - never reached
        raise AssertionError

    def _truncate_cache(self, seq_id, n_tokens):
        pass

    def encode(self, text, add_special=True):
        return [ord(c) % self.vocab_size for c in text.lower()]

    def decode(self, ids):
        return "".join(f"\u2603{i}\u2603" for i in ids)

    def token_text(self, token_id):
        return f"\u2603{token_id}\u2603"

    @property
    def chat_template(self):
        return None

    def apply_chat_template(self, messages):  # pragma: no cover
        raise ConfigError("none")


@pytest.mark.parametrize("mode", ["auto", "text", "intersect"])
def test_pairs_that_cannot_be_bridged_are_refused(smol, mode):
    d = CrossVocabDrafter(_Unbridgeable(), mode)
    with pytest.raises(VocabularyMismatchError, match="cannot bridge") as e:
        d.bind(smol)
    msg = str(e.value)
    assert "lowercasing-toy" in msg and "\n" not in msg
    if mode != "intersect":
        assert "byte for byte" in msg
    if mode != "text":
        assert "share only 0 token strings" in msg


# ---- re-tokenization -----------------------------------------------------------------------------

EDGE_CASES = [
    ("The cat", " sat on the mat."),  # leading space
    ("a", "    b  c"),  # several spaces
    ("line one", "\n\n\tindented\r\n"),  # newlines, tab
    ("In", " 2024, 1,234,567.89 units"),  # digits
    ("Déjà", " vu, naïve café, Größe, 東京タワー"),  # non-ASCII
    ("Party", " 😀👍🏽 🇫🇷!"),  # emoji, modifier, flag
    ("It is", " unbelievable"),  # SmolLM2 splits it, Gemma has one token
    ("hel", "lo world"),  # the draft continues inside the last committed word
]


@pytest.mark.parametrize("which", ["smol", "gemma"])
@pytest.mark.parametrize("committed, new", EDGE_CASES)
def test_retokenized_draft_lines_up_with_committed_tokens(tables, which, committed, new):
    tab = tables[which]
    ctx = tab.encode(committed)
    left = tab.bytes_of(ctx[-4:])
    nb = new.encode()
    ids = retokenize(tab, left, nb, final=True)
    assert tab.bytes_of(ids) == nb, f"{tab.backend.model_id}: {tab.bytes_of(ids)!r}"
    assert tab.backend.decode(ctx + ids) == committed + new
    # not final: the last token (which more text could extend) is dropped, the rest is kept
    partial = retokenize(tab, left, nb, final=False)
    assert partial == ids[: len(partial)] and len(partial) == len(ids) - 1
    # the same text as one string tokenizes the same way where the committed boundary allows
    whole = tab.encode(committed + new)
    if whole[: len(ctx)] == ctx:
        assert ids == whole[len(ctx) :]


def test_a_word_one_tokenizer_merges_and_the_other_splits(tables):
    s, g = tables["smol"], tables["gemma"]
    assert len(s.encode(" unbelievable")) == 2 and len(g.encode(" unbelievable")) == 1
    # SmolLM2's two draft tokens become Gemma's one token, and back
    two = s.encode(" unbelievable")
    assert retokenize(g, g.bytes_of(g.encode("It is")), s.bytes_of(two), final=True) == g.encode(" unbelievable")
    assert retokenize(s, s.bytes_of(s.encode("It is")), g.bytes_of(g.encode(" unbelievable")), final=True) == two


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_text_ending_inside_a_multibyte_character(tables, which):
    tab = tables[which]
    for text in ("naïve", "東京", "ok 😀"):
        b = text.encode()
        assert tab.bytes_of(retokenize(tab, b"", b, final=True)) == b
        for cut in range(1, 4):
            nb = b[: len(b) - cut]
            whole = nb[: utf8_complete_len(nb)]
            got = tab.bytes_of(retokenize(tab, b"", nb, final=True))
            assert whole.startswith(got)  # nothing of the incomplete character (BPE tokens may split one)
            if whole != nb:  # text was cut inside a character: the token before it may still grow
                assert got == tab.bytes_of(retokenize(tab, b"", whole, final=False))
    assert utf8_complete_len("é".encode()[:1]) == 0
    assert utf8_complete_len(b"ab" + "😀".encode()[:3]) == 2
    assert utf8_complete_len("😀".encode()) == 4
    assert utf8_complete_len(b"\x80\x80") == 2  # invalid bytes never hold text back


def test_special_token_text_in_a_draft_is_not_turned_into_the_special_token(tables):
    s = tables["smol"]
    assert retokenize(s, b"", b"Hi<|im_end|>", final=True) == s.encode("Hi")


def test_special_tokens_in_the_prompt(smol, gemma):
    """A special token of the target in a raw prompt: written out, it is the drafter's special
    token where the drafter has one with that text, plain text otherwise."""
    d = build_drafter(f"model:{GEMMA},threads=1", smol)
    try:
        ids = smol.encode("<|im_start|>user\nHi<|im_end|>\n")
        assert smol.encode("<|im_start|>")[0] in ids  # the target parsed it as a special token
        st = d.start(ids)
        assert gemma.decode(st.dprompt) == "<|im_start|>user\nHi<|im_end|>\n"  # Gemma lacks it: text
        d.finish(st)
    finally:
        d.close()
    d = build_drafter(f"model:{SMOL},threads=1", gemma)
    try:
        st = d.start(gemma.encode("Q: <|im_end|> <end_of_turn> A:"))
        assert smol.encode("<|im_end|>")[0] in st.dprompt  # SmolLM2 has <|im_end|>: parsed as its own
        assert st.dprompt == smol.encode("Q: <|im_end|> <end_of_turn> A:")  # Gemma's <bos> left out
        d.finish(st)
    finally:
        d.close()


def test_the_drafter_renders_chat_messages_with_its_own_template(smol, gemma):
    """Gemma target (no template) and SmolLM2 drafter: given the messages, the drafter applies
    SmolLM2's chat template; given only ids, it re-tokenizes their text."""
    d = build_drafter(f"model:{SMOL},threads=1", gemma)
    try:
        msgs = [{"role": "user", "content": "Name three colors."}]
        st = d.start(gemma.encode("Name three colors."), msgs)
        assert st.dprompt == smol.apply_chat_template(msgs)
        d.finish(st)
        st = d.start(gemma.encode("Name three colors."))
        assert smol.decode(st.dprompt) == "Name three colors."
        d.finish(st)
    finally:
        d.close()


# ---- greedy identity -----------------------------------------------------------------------------


def _identity(target, drafter_spec: str, prompts, ks=(4,), max_new: int = 32):
    """Greedy output with the drafter equals plain greedy output; returns [drafted, accepted, full-rejection steps]."""
    d = build_drafter(drafter_spec, target)
    totals = [0, 0, 0]
    try:
        assert isinstance(d, CrossVocabDrafter)
        plain = SpeculativeGenerator(target, NoDrafter())
        gen = SpeculativeGenerator(target, d)
        for p in prompts:
            ids = plain.encode_prompt(p)
            assert len(ids) <= 200
            want = plain.generate(ids, max_new_tokens=max_new).token_ids
            for k in ks:
                r = gen.generate(p, max_new_tokens=max_new, num_speculative_tokens=k, draft_policy="fixed")
                assert r.prompt_token_ids == ids
                assert r.token_ids == want, f"{drafter_spec} k={k} {p[:40]!r}: outputs differ"
                totals[0] += r.stats.draft_tokens
                totals[1] += r.stats.accepted_tokens
                totals[2] += r.stats.accept_counts[0]
    finally:
        d.close()
    return totals


def _check_accepted_and_rejected(totals, label):
    drafted, accepted, zero = totals
    assert accepted > 0, f"{label}: no draft token was accepted"
    assert accepted < drafted and zero > 0, f"{label}: no draft token was rejected"


@pytest.mark.parametrize("mode", ["auto", "intersect"])
def test_greedy_identity_smollm2_drafts_for_gemma(gemma, mode):
    prompts = _prompts() if mode == "auto" else _prompts()[::2]
    totals = _identity(gemma, f"model:{SMOL},vocab={mode},threads=1", prompts, ks=(2, 5) if mode == "auto" else (4,))
    _check_accepted_and_rejected(totals, f"SmolLM2 -> Gemma vocab={mode}")


def test_greedy_identity_gemma_drafts_for_smollm2_chat(smol):
    totals = _identity(smol, f"model:{GEMMA},threads=1", _prompts()[1:4])
    _check_accepted_and_rejected(totals, "Gemma -> SmolLM2")


@pytest.fixture(scope="module")
def qwen():
    from speculative.backends import load_backend

    try:
        b = load_backend(QWEN, n_ctx=1024)
    except (ModelNotFoundError, ModelLoadError) as e:
        pytest.skip(f"{QWEN} is not installed: {e}")
    yield b
    b.close()


@pytest.mark.qwen
@pytest.mark.parametrize("draft", [SMOL, GEMMA])
def test_greedy_identity_small_drafters_for_qwen_coder(qwen, draft):
    prompts = [CODE_PROMPTS[0], _prompts()[1]]
    totals = _identity(qwen, f"model:{draft},threads=1", prompts, max_new=24)
    _check_accepted_and_rejected(totals, f"{draft} -> Qwen2.5-Coder-1.5B")


# ---- the drafter's KV cache -------------------------------------------------------------------


def test_draft_cache_is_rolled_back_never_prefilled_twice(gemma):
    """Across a generation the drafter's cache is never cut into its prompt and no forward pass
    after the first (the lazy prefill) feeds more than a few tokens; afterwards, synced to the
    output text, it keeps all but the look-behind and continues exactly like a fresh prefill."""
    from speculative.backends.base import ForwardRequest
    from speculative.drafters.cross_vocab import LOOKBEHIND

    d = build_drafter(f"model:{SMOL},threads=1", gemma)
    m = d.model
    fed: list[int] = []
    cuts: list[int] = []
    forward, truncate = m.forward, m.truncate

    def counting_forward(reqs):
        fed.append(sum(len(r.tokens) for r in reqs))
        return forward(reqs)

    def counting_truncate(seq, n):
        if n < len(m.cached_tokens(seq)):
            cuts.append(n)
        truncate(seq, n)

    states: list[CrossVocabState] = []
    start = d.start
    d.start = lambda *a, **k: states.append(start(*a, **k)) or states[-1]
    try:
        m.truncate(0, 0)
        m.forward, m.truncate = counting_forward, counting_truncate
        gen = SpeculativeGenerator(gemma, d)
        r = gen.generate(_prompts()[0], max_new_tokens=32, num_speculative_tokens=4, draft_policy="fixed")
        m.forward, m.truncate = forward, truncate
        st = states[-1]
        assert r.stats.accept_counts[0] > 0 and r.stats.accepted_tokens > 0
        n_prompt = len(st.dprompt)
        # the first proposal prefills the drafter's prompt and the first output token's text (but its last token)
        assert n_prompt - 1 <= fed[0] <= n_prompt + 4
        assert max(fed[1:]) <= 2 * 4 + 2, f"a later forward fed {max(fed[1:])} tokens: a re-prefill"
        assert cuts and min(cuts) >= n_prompt, "the drafter's cache was cut into its prompt"
        # sync the drafter to the final output: its tokens spell the output text
        cached = list(m.cached_tokens(st.seq_id))
        d._absorb(st, r.prompt_token_ids + r.token_ids)
        d._sync(st)
        out = gemma.decode(r.token_ids).encode()
        assert d.dtab.bytes_of(st.dtoks) == out[: utf8_complete_len(out)]
        full = st.dprompt + st.dtoks
        kept = m.reuse_prefix(st.seq_id, full, keep_last=1)
        assert cached[:kept] == full[:kept] and kept >= len(full) - LOOKBEHIND - 1
        nxt = m.forward([ForwardRequest(st.seq_id, full[kept:], logits="last")])[0].logits[-1].copy()
        np.testing.assert_allclose(nxt, next_logits_fresh(m, full), rtol=0, atol=1e-4)
    finally:
        m.forward, m.truncate = forward, truncate
        d.close()


# ---- sampling: token-level intersection ------------------------------------------------------

PASS_P = 1e-3


#: (raw prompt for Gemma, greedy continuation tokens in the context): an English position at two depths,
#: and the end of a Japanese request, where SmolLM2 puts about 40% of its mass on partial UTF-8
#: tokens that Gemma lacks
TLI_CONTEXTS = [
    (spec_bench_prompts({"writing": 1})[0]["turns"][0], 1),
    (spec_bench_prompts({"writing": 1})[0]["turns"][0], 6),
    ("Translate to Japanese: Good morning.\nJapanese:", 0),
]


def _tli_rows(target, drafter_spec, params, contexts=TLI_CONTEXTS):
    """(p, q, q_unrestricted) at real contexts (prompt + greedy continuation): p the target's
    processed distribution; q the restricted distribution the TLI drafter reports for its draft
    token (its own propose call), over target ids; q_unrestricted the drafter's processed
    distribution without the restriction, mapped to target ids (its mass on tokens outside the
    intersection dropped)."""
    d = build_drafter(drafter_spec, target)
    try:
        assert isinstance(d, CrossVocabDrafter)
        plain = SpeculativeGenerator(target, NoDrafter())
        s = Sampler(params)
        rows = []
        for prompt, cut in contexts:
            ids = plain.encode_prompt(prompt)
            ctx = ids + (plain.generate(ids, max_new_tokens=cut).token_ids if cut else [])
            p = s.probs(next_logits_fresh(target, ctx))
            st = d.start(ids)
            prop = d.propose(st, ctx, 1, s, np.random.default_rng(0))
            d.finish(st)
            q = prop.probs[0]
            assert abs(q.sum() - 1) < 1e-9 and q[prop.tokens[0]] > 0
            # the drafter's own next-token logits at the same text (the context of its draft token)
            dl = next_logits_fresh(d.model, st.dprompt + st.dtoks[:-1])
            assert d.dtab.bytes_of(st.dtoks[:-1]) == d.ttab.bytes_of(ctx[len(ids) :])
            masked = np.where(d.inter.mask, dl, np.float32(-np.inf))
            np.testing.assert_allclose(q[d.inter.target_ids], s.probs(masked)[d.inter.draft_ids], rtol=1e-6, atol=1e-9)
            qu_d = s.probs(dl)
            qu = np.zeros_like(q)
            qu[d.inter.target_ids] = qu_d[d.inter.draft_ids]
            rows.append((p, q, qu))
        return rows
    finally:
        d.close()


def _counts(p, q, q_verify, n, rng):
    """Emitted-token counts of n verification steps: x ~ q, verified with q_verify as the drafter's q."""
    counts = np.zeros(p.shape[0], dtype=np.int64)
    for _ in range(n):
        x = sample_from(q, rng)
        res = rejection_sample(lambda i: p, [x], q_verify[None], rng)
        counts[x if res.num_accepted == 1 else res.next_token] += 1
    return counts


def _compact(p, *qs):
    """Restrict to the tokens some distribution has; merge the tokens only p has into one cell
    (q = 0 there, so the residual treats them as one: the emitted cell's law is unchanged)."""
    anyq = np.zeros(p.shape[0], dtype=bool)
    for q in qs:
        anyq |= q > 0
    rest = (~anyq) & (p > 0)
    out = [np.r_[p[anyq], p[rest].sum()]]
    for q in qs:
        out.append(np.r_[q[anyq], 0.0])
    return out


def _power(p, emitted, n, alpha):
    """Power of the chi-square test (cells with expected count < 5 pooled) against ``emitted``, and Cohen's w."""
    exp = p * n
    big = exp >= 5
    p0 = np.r_[p[big], p[~big].sum()]
    p1 = np.r_[emitted[big], emitted[~big].sum()]
    keep = p0 > 0
    w2 = float(np.sum((p1[keep] - p0[keep]) ** 2 / p0[keep]))
    df = int(keep.sum()) - 1
    crit = stats.chi2.ppf(1 - alpha, df)
    return float(stats.ncx2.sf(crit, df, n * w2)), w2**0.5


def _wrong_law(p, q, qw):
    """Exact law of the emitted token when drafts come from q but the acceptance ratio and residual use qw."""
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(q > 0, np.minimum(1.0, p / np.where(qw > 0, qw, 1.0)), 0.0)
    r = np.maximum(p - qw, 0.0)
    r /= r.sum()
    return q * acc + (1 - float((q * acc).sum())) * r


@pytest.mark.parametrize(
    "params, n",
    [
        (SamplingParams(temperature=1.0, top_k=40), 100_000),
        (SamplingParams(temperature=0.7, top_p=0.9), 100_000),
        (SamplingParams(temperature=1.0), 30_000),  # no truncation: 46k shared tokens
    ],
)
def test_tli_verification_reproduces_the_target_distribution(gemma, params, n):
    """SmolLM2 drafts for Gemma with the restricted q; the emitted token must follow p.

    Criterion: chi-square p-value > 1e-3 at each of 3 real contexts (fixed seed). Power: the
    smallest effect this detects with probability 0.9 is printed; measured here, Cohen's w of
    about 0.02 for 100k draws on the truncated supports, 0.05-0.07 for 30k draws on the full
    vocabulary (tokens q never proposes merged into one cell, which leaves the law unchanged)."""
    rng = np.random.default_rng(2025)
    rows = _tli_rows(gemma, f"model:{SMOL},vocab=intersect,threads=1", params)
    tv = [0.5 * np.abs(p - q).sum() for p, q, _ in rows]
    assert min(tv) > 0.02 and any(t < 0.98 for t in tv), f"p and q should differ, but not entirely: {tv}"
    for i, (p, q, _) in enumerate(rows):
        pc, qc = _compact(p, q)
        pval = _pvalue(_counts(pc, qc, qc, n, rng), pc)
        df = int((pc * n >= 5).sum())
        w90 = next(w for w in np.arange(0.005, 0.5, 0.0025) if stats.ncx2.sf(stats.chi2.ppf(1 - PASS_P, df), df, n * w * w) > 0.9)
        print(f"[tli] position {i}: p-value {pval:.3f}, {df + 1} cells, detects w >= {w90:.3f} with power 0.9")
        assert pval > PASS_P, f"position {i}: p-value {pval:.2e}"


def test_tli_with_the_unrestricted_drafter_distribution_as_q_is_caught(gemma):
    """The mutation: drafts drawn from the restricted q, but the acceptance ratio and residual use the
    drafter's unrestricted distribution (its mass outside the intersection dropped, not renormalized).
    Its exact emitted law differs from p by a computed effect size; the chi-square test at the draw
    count used must have power > 0.99 against it at alpha 1e-6, and must reject it."""
    params = SamplingParams(temperature=1.0)
    # the Japanese context: the drafter puts much mass outside the intersection there
    (p, q, qu), = _tli_rows(gemma, f"model:{SMOL},vocab=intersect,threads=1", params, TLI_CONTEXTS[2:])
    pc, qc, quc = _compact(p, q, qu)
    n = 30_000
    power, w = _power(pc, _wrong_law(pc, qc, quc), n, 1e-6)
    print(f"[tli mutation] drafter mass outside the intersection {1 - qu.sum():.3f}, Cohen's w {w:.3f}, power {power:.4f}")
    assert power > 0.99, f"the test could not detect the mutation (w {w:.3f}, power {power:.3f})"
    rng = np.random.default_rng(2025)
    assert _pvalue(_counts(pc, qc, quc, n, rng), pc) < 1e-6
