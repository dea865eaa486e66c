"""Structured output under speculation (JSON, JSON Schema, regex, Lark/GBNF grammars) on SmolLM2.

Greedy: constrained output with speculation (n-gram and the shipped draft model, k in
{1, 4}, draft policy fixed; n-gram token trees) is identical, token for token, to plain
constrained greedy decoding (drafter none), drafts were both accepted and rejected, and
the output parses and validates.

Sampling: the whole output of a small regular language ("[1-4]{3}": three digits,
each a single token in SmolLM2's vocabulary, so a string is a token path) is drawn
N = 1,500 times with speculation, and its distribution compared with the exact
constrained target distribution (enumerated: the masked, temperature-processed
target probabilities along every path). The target's logits are SmolLM2's own,
computed once per distinct context (:class:`MemoBackend`), so thousands of runs take
seconds. Drafters: one that draws from a fixed q over a few tokens, some of them
forbidden (steered: q masked to the allowed tokens; unsteered: cut at the first
forbidden token, whose position then draws from the residual), and the shipped
draft model (steered). Criterion: chi-square goodness of fit (cells
with expected count < 5 pooled), p-value > 1e-3 with fixed seeds. The same harness
rejects three deliberately wrong engines: the cut position drawing from p instead of
the residual; a steered drafter reporting its unmasked q; the target left unmasked at
the draft positions.

Also: spec errors (one line), masks along chains and trees, the CLI options, the
server's ``response_format`` (openai client, streaming, 400s), the bench's prompts
and summary, and the transformers backend's masks (equal to llama.cpp's).
"""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import numpy as np
import pytest
from scipy import stats

from speculative import request as request_mod
from speculative.backends.base import Backend, ForwardRequest, ForwardResult
from speculative.config import SamplingParams
from speculative.constraints import Constraint, ConstraintSpec, apply_masks
from speculative.drafters import DraftModelDrafter, build_drafter
from speculative.drafters.base import DraftProposal, Drafter
from speculative.engine import DecodeRequest, SpeculativeGenerator
from speculative.errors import ConfigError
from speculative.sampling import process_probs, sample_from

DRAFT_MODEL = "model:smollm2-135m-instruct-draft"
PASS_P = 1e-3

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                   "languages": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "city", "languages"],
    "additionalProperties": False,
}
EXTRACT = [
    "Extract as JSON: Maria Keller is 34 years old, lives in Berlin and speaks German, English and Spanish.",
    "Extract as JSON: Daniel Okafor, aged 51, moved to Lagos last year; he speaks Yoruba and English.",
]


# ---- spec validation -------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize("spec, fragment", [
    (lambda: ConstraintSpec.json_schema('{"type": "objekt"}'), "invalid json schema"),
    (lambda: ConstraintSpec.json_schema("not json"), "not valid JSON"),
    (lambda: ConstraintSpec.json_schema("[1, 2]"), "must be a JSON object"),
    (lambda: ConstraintSpec.json_schema({"type": "string", "pattern": "(("}), "unclosed group"),
    (lambda: ConstraintSpec.regex("[a-"), "unclosed character class"),
    (lambda: ConstraintSpec.regex(""), "is empty"),
    (lambda: ConstraintSpec.grammar("start: foo"), "unknown name"),
    (lambda: ConstraintSpec.grammar('root ::= "a'), "GBNF"),
])
def test_bad_specs_give_one_line_errors(spec, fragment):
    with pytest.raises(ConfigError) as e:
        spec().validate()
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_keywords_choose_one_constraint(smol):
    gen = SpeculativeGenerator(smol)
    with pytest.raises(ConfigError, match="at most one"):
        gen.new_request("Hi", regex="a+", json_object=True)
    req = gen.new_request("Hi", grammar='root ::= "yes" | "no"')
    assert req.constraint is not None and req.cfg.constraint.kind == "grammar"
    req.release()


def test_masks_along_a_draft_and_rollback(smol):
    """Row i of a chain's masks is the allowed set after the draft's first i tokens; a forbidden token cuts it;
    the matcher ends where it started. A tree loses exactly the nodes under a forbidden one."""
    c = Constraint.compile(ConstraintSpec.regex("[1-4]{3}"), smol)
    digit = {d: smol.encode(d, add_special=False)[0] for d in "12345"}
    allowed = {digit[d] for d in "1234"}
    start = c.mask()
    assert set(np.flatnonzero(start)) == allowed
    n, masks, forbidden = c.chain_masks([digit["1"], digit["2"], digit["5"], digit["3"]])
    assert (n, forbidden) == (2, True) and masks.shape == (3, smol.vocab_size)
    assert all(set(np.flatnonzero(m)) == allowed for m in masks)
    n, masks, forbidden = c.chain_masks([digit["1"], digit["2"], digit["3"], digit["4"]])
    assert (n, forbidden) == (3, False)  # the third digit completes the grammar: nothing may follow
    assert set(np.flatnonzero(masks[3])) <= set(smol.eos_token_ids)
    assert np.array_equal(c.mask(), start) and not c.stopped
    # tree: 1 -> {2 -> {5}, 5 -> {3}}, 5
    toks = [digit["1"], digit["2"], digit["5"], digit["5"], digit["3"]]
    parents = [-1, 0, 1, 0, 3]
    keep, root, node_masks = c.tree_masks(toks + [digit["5"]], parents + [-1])
    assert keep == [0, 1] and len(node_masks) == 2 and np.array_equal(root, start)
    c.consume(digit["4"])
    with pytest.raises(RuntimeError, match="violates the constraint"):
        c.consume(digit["5"])


# ---- greedy identity ------------------------------------------------------------------------


def _valid(text: str, schema: dict) -> dict:
    obj = json.loads(text)
    jsonschema.validate(obj, schema)
    return obj


@pytest.fixture(scope="module")
def plain_json(smol):
    gen = SpeculativeGenerator(smol)
    return [gen.generate(p, json_schema=PERSON, max_new_tokens=96) for p in EXTRACT]


@pytest.fixture(scope="module")
def draft_model(smol):
    d = build_drafter(DRAFT_MODEL, smol)
    yield d
    d.close()


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("drafter", ["ngram", DRAFT_MODEL])
def test_greedy_json_schema_identical_to_plain(smol, draft_model, plain_json, drafter, k):
    d = draft_model if drafter == DRAFT_MODEL else build_drafter(drafter, smol)
    gen = SpeculativeGenerator(smol, d)
    drafted = accepted = 0
    for prompt, plain in zip(EXTRACT, plain_json):
        r = gen.generate(prompt, json_schema=PERSON, max_new_tokens=96, num_speculative_tokens=k, draft_policy="fixed")
        assert r.token_ids == plain.token_ids, f"{drafter}, k={k}: differs from plain constrained decoding"
        assert r.finish_reason == "stop" and r.text == plain.text
        _valid(r.text, PERSON)
        drafted += r.stats.draft_tokens
        accepted += r.stats.accepted_tokens
    assert 0 < accepted < drafted, f"{drafter}, k={k}: drafts were not both accepted and rejected"


@pytest.mark.parametrize("kind", ["regex", "lark", "gbnf", "json_object"])
def test_greedy_other_constraints_identical_to_plain(smol, draft_model, kind):
    prompt = {
        "regex": "Write today's date as YYYY-MM-DD, then the time.",
        "lark": "Give me three fruits, comma-separated.",
        "gbnf": "Is the sky blue? Answer and explain briefly.",
        "json_object": "Describe a cat as JSON.",
    }[kind]
    kw = {
        "regex": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]"},
        "lark": {"grammar": 'start: fruit (", " fruit)*\nfruit: /[a-z]+/'},
        "gbnf": {"grammar": 'root ::= ("Yes" | "No") ", because " [a-z ]+ "."'},
        "json_object": {"json_object": True},
    }[kind]
    plain = SpeculativeGenerator(smol).generate(prompt, max_new_tokens=48, **kw)
    drafted = 0
    for d in (build_drafter("ngram", smol), draft_model):
        r = SpeculativeGenerator(smol, d).generate(prompt, max_new_tokens=48, num_speculative_tokens=4,
                                                    draft_policy="fixed", **kw)
        assert r.token_ids == plain.token_ids, f"{kind}, {d.description}"
        drafted += r.stats.draft_tokens
    assert drafted > 0
    if kind == "json_object" and plain.finish_reason == "stop":
        assert isinstance(json.loads(plain.text), dict)
    if kind == "regex":
        import re

        assert re.fullmatch(kw["regex"], plain.text) and plain.finish_reason == "stop"


def test_greedy_token_trees_identical_to_plain(plain_json, monkeypatch):
    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram,tree=3", n_ctx=2048)
    trees = []
    orig = DecodeRequest._accept_tree
    monkeypatch.setattr(DecodeRequest, "_accept_tree", lambda self, *a, **kw: trees.append(1) or orig(self, *a, **kw))
    try:
        for prompt, plain in zip(EXTRACT, plain_json):
            r = gen.generate(prompt, json_schema=PERSON, max_new_tokens=96, num_speculative_tokens=4,
                             draft_policy="fixed")
            assert r.token_ids == plain.token_ids
            assert r.stats.accepted_tokens > 0
    finally:
        gen.close()
    assert trees, "no token tree was verified"


def test_generation_ends_when_the_grammar_is_complete(smol):
    gen = SpeculativeGenerator(smol, build_drafter("ngram", smol))
    r = gen.generate("Say yes or no.", regex="(yes|no)", max_new_tokens=20, num_speculative_tokens=4,
                     draft_policy="fixed")
    assert r.text in ("yes", "no") and r.finish_reason == "stop"
    assert not set(r.token_ids) & set(smol.eos_token_ids)
    r = gen.generate("Count.", regex="[0-9]+", max_new_tokens=5, draft_policy="fixed")  # may go on: ends by length
    assert r.text.isdigit() and r.finish_reason == "length" and len(r.token_ids) == 5


# ---- sampling: the exact constrained distribution ------------------------------------------------


class MemoBackend(Backend):
    """SmolLM2's logits, computed once per distinct context (a test double: thousands of runs over a
    small language need only its few distinct contexts)."""

    name = "memo"
    batch_invariant = True

    def __init__(self, inner: Backend):
        super().__init__()
        self.inner = inner
        self.tokenizer_of = inner
        self.model_id = f"memo({inner.model_id})"
        self.vocab_size, self.n_ctx, self.eos_token_ids = inner.vocab_size, inner.n_ctx, inner.eos_token_ids
        self.max_sequences = 1
        self._init_sequences()
        self._memo: dict[tuple[int, ...], np.ndarray] = {}

    def next_logits(self, ctx) -> np.ndarray:
        key = tuple(int(t) for t in ctx)
        if key not in self._memo:
            b = self.inner
            seq = b.allocate_sequence(key)
            try:
                kept = b.reuse_prefix(seq, key, keep_last=1)
                self._memo[key] = b.forward([ForwardRequest(seq, key[kept:], logits="last")])[0].logits[-1].copy()
            finally:
                b.release_sequence(seq)
        return self._memo[key]

    def _forward(self, requests):
        out = []
        for r in requests:
            base = list(self._seqs[r.seq_id].tokens)
            toks = [int(t) for t in r.tokens]
            rows = r.output_rows()
            lg = [self.next_logits(base + toks[: i + 1]) for i in rows]
            out.append(ForwardResult(np.stack(lg) if lg else np.zeros((0, self.vocab_size), np.float32)))
        return out

    def _truncate_cache(self, seq_id, n_tokens):
        pass

    def encode(self, text, add_special=True):
        return self.inner.encode(text, add_special)

    def decode(self, ids):
        return self.inner.decode(ids)

    def token_text(self, token_id):
        return self.inner.token_text(token_id)

    @property
    def chat_template(self):
        return self.inner.chat_template

    def apply_chat_template(self, messages):
        return self.inner.apply_chat_template(messages)


class FixedQDrafter(Drafter):
    """Draws each draft token from a fixed distribution q over a few tokens, forbidden ones included.

    steer: q masked to the allowed tokens at each draft position (renormalized), which is what it then
    samples from and reports; unsteered, the engine cuts the draft at the first forbidden token.
    report_unmasked (a deliberate bug): steered sampling, but the unmasked q reported.
    """

    kind = "fixed-q"

    def __init__(self, q: np.ndarray, steer: bool, report_unmasked: bool = False):
        super().__init__()
        self.q = q
        self.steerable = steer
        self.report_unmasked = report_unmasked

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        toks, rows = [], []
        for _ in range(max_tokens):
            q = self.q
            if guide is not None:
                q = np.where(guide.mask(), q, 0.0)
                if not q.sum() > 0:
                    break
                q = q / q.sum()
            t = sample_from(q, rng)
            toks.append(t)
            rows.append(self.q if self.report_unmasked else q)
            if guide is not None and (not guide.push(t) or guide.stopped):
                break
        return DraftProposal(tokens=toks, probs=np.stack(rows) if rows else None)


REGEX = "[1-4]{3}"
TEMPERATURE = 1.5
N_RUNS = 1500


@pytest.fixture(scope="module")
def memo(smol):
    return MemoBackend(smol)


@pytest.fixture(scope="module")
def digits_prompt(smol):
    return SpeculativeGenerator(smol).encode_prompt("Roll a four-sided die three times and write the three results.")


@pytest.fixture(scope="module")
def exact_dist(memo, digits_prompt):
    """The constrained target's distribution of the whole output: products of the masked, processed p along
    every token path the grammar allows (here one path per string)."""
    c = Constraint.compile(ConstraintSpec.regex(REGEX), memo)
    params = SamplingParams(temperature=TEMPERATURE)
    dist: Counter = Counter()

    def walk(ctx, prob):
        if c.stopped:
            dist[memo.decode(ctx)] += prob
            return
        p = process_probs(apply_masks(memo.next_logits(digits_prompt + ctx)[None], c.mask()[None])[0], params)
        for t in np.flatnonzero(p):
            c.consume(int(t))
            walk(ctx + [int(t)], prob * p[t])
            c.rollback(1)

    walk([], 1.0)
    assert abs(sum(dist.values()) - 1) < 1e-9 and len(dist) == 64
    return dist


def _fixed_q(smol) -> np.ndarray:
    q = np.zeros(smol.vocab_size)
    for text, mass in (("1", 0.1), ("2", 0.3), ("3", 0.1), ("4", 0.1), ("7", 0.2), ("x", 0.2)):
        q[smol.encode(text, add_special=False)[0]] = mass
    return q


def _sample(memo, drafter, prompt, n=N_RUNS, k=3):
    gen = SpeculativeGenerator(memo, drafter)
    counts: Counter = Counter()
    drafted = accepted = 0
    for i in range(n):
        r = gen.generate(prompt, regex=REGEX, temperature=TEMPERATURE, seed=1000 + i, max_new_tokens=8,
                         num_speculative_tokens=k, draft_policy="fixed")
        counts[r.text] += 1
        drafted += r.stats.draft_tokens
        accepted += r.stats.accepted_tokens
    return counts, drafted, accepted


def _p_value(counts: Counter, dist: Counter) -> float:
    n = sum(counts.values())
    cells = sorted(dist, key=lambda s: -dist[s])
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for s in cells:
        if n * dist[s] >= 5:
            obs.append(counts[s])
            exp.append(n * dist[s])
        else:
            pool_o += counts[s]
            pool_e += n * dist[s]
    assert sum(counts[s] for s in counts if s not in dist) == 0, "an output outside the language"
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    return float(stats.chisquare(obs, exp).pvalue)


def _drafter(name, smol, draft_model):
    if name == "fixed-q steered":
        return FixedQDrafter(_fixed_q(smol), steer=True)
    if name == "fixed-q cut":
        return FixedQDrafter(_fixed_q(smol), steer=False)
    return DraftModelDrafter(MemoBackend(draft_model.model))  # the shipped draft model's logits, memoized


@pytest.mark.parametrize("name", ["fixed-q steered", "fixed-q cut", "draft model steered"])
def test_sampled_output_is_the_constrained_target_distribution(smol, memo, draft_model, digits_prompt, exact_dist,
                                                               name):
    counts, drafted, accepted = _sample(memo, _drafter(name, smol, draft_model), digits_prompt)
    assert 0 < accepted < drafted
    p = _p_value(counts, exact_dist)
    print(f"[constrained sampling] {name}: chi-square p = {p:.3f}, accepted {accepted}/{drafted} draft tokens")
    assert p > PASS_P, f"{name}: chi-square p = {p:.2e}"


def _wrong_cut_samples_p(monkeypatch):
    orig = DecodeRequest._constrain

    def constrain(self, p):
        out = orig(self, p)
        out.cut = None  # bug: the cut position draws from p, not from the residual
        return out

    monkeypatch.setattr(DecodeRequest, "_constrain", constrain)


def _wrong_unmasked_draft_positions(monkeypatch):
    def masks_row0_only(logits, masks):  # bug: the target is masked at the last committed token only
        out = np.array(logits, dtype=np.float32, copy=True)
        out[:1] = apply_masks(logits[:1], masks[:1])
        return out

    monkeypatch.setattr(request_mod, "apply_masks", masks_row0_only)


@pytest.mark.parametrize("bug", ["cut draws from p", "steered q reported unmasked", "target unmasked at drafts"])
def test_the_statistical_test_catches_wrong_engines(smol, memo, digits_prompt, exact_dist, monkeypatch, bug):
    q = _fixed_q(smol)
    if bug == "cut draws from p":
        _wrong_cut_samples_p(monkeypatch)
        drafter = FixedQDrafter(q, steer=False)
    elif bug == "steered q reported unmasked":
        drafter = FixedQDrafter(q, steer=True, report_unmasked=True)
    else:
        _wrong_unmasked_draft_positions(monkeypatch)
        drafter = FixedQDrafter(q, steer=True)
    try:
        counts, _, _ = _sample(memo, drafter, digits_prompt)
    except RuntimeError as e:  # an unmasked row emitted a forbidden token: caught as well
        assert "violates the constraint" in str(e)
        return
    p = _p_value(counts, exact_dist)
    print(f"[constrained sampling] wrong engine ({bug}): chi-square p = {p:.1e}")
    assert p < PASS_P, f"{bug}: not detected (chi-square p = {p:.2e})"


# ---- command line and server ------------------------------------------------------------------------


def run_cli(capsys, *argv):
    from speculative.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_structured_output(capsys, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    base = ["generate", EXTRACT[0], "--json", "--max-new-tokens", "96", "--k", "4"]
    code, out, err = run_cli(capsys, *base, "--json-schema", str(schema))
    assert code == 0, err
    res = json.loads(out)
    assert res["finish_reason"] == "stop" and _valid(res["text"], PERSON)["age"] == 34
    code, out2, err = run_cli(capsys, *base, "--json-schema", json.dumps(PERSON), "--drafter", "none")
    assert code == 0 and json.loads(out2)["token_ids"] == res["token_ids"]
    gbnf = tmp_path / "answer.gbnf"
    gbnf.write_text('root ::= ("Yes" | "No") "."\n')
    code, out, err = run_cli(capsys, "generate", "Is water wet?", "--grammar", str(gbnf), "--json")
    assert code == 0 and json.loads(out)["text"] in ("Yes.", "No.")
    code, out, err = run_cli(capsys, "generate", "Pick a number.", "--regex", "[0-9]{2}", "--json")
    assert code == 0 and len(json.loads(out)["text"]) == 2
    code, out, err = run_cli(capsys, "generate", "A cat as JSON.", "--json-object", "--max-new-tokens", "8")
    assert code == 0 and out.lstrip().startswith("{")


@pytest.mark.quick
@pytest.mark.parametrize("argv, fragment", [
    (["--json-schema", "nosuchfile.json"], "neither a file nor a JSON object"),
    (["--json-schema", '{"type": "objekt"}'], "invalid json schema"),
    (["--json-schema", '{"type": '], "not valid JSON"),
    (["--regex", "(("], "invalid regex"),
    (["--grammar", "nosuch.lark"], "no such file"),
])
def test_cli_bad_constraints(capsys, argv, fragment):
    code, _, err = run_cli(capsys, "generate", "Hi", *argv)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.quick
def test_cli_one_constraint_at_a_time(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, "generate", "Hi", "--regex", "a", "--json-object")
    assert e.value.code == 2


@pytest.fixture(scope="module")
def server():
    from conftest import InProcessServer

    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", n_ctx=2048, max_sequences=2)
    srv = InProcessServer(gen, "smol")
    yield srv.url
    srv.close()
    gen.close()


def _post(url, path, body):
    import httpx

    return httpx.post(url + path, json=body, timeout=300)


def test_server_response_format(server):
    import openai

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": EXTRACT[1]}]
    spec = {"num_speculative_tokens": 4, "draft_policy": "fixed"}
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=96, response_format=fmt,
                                       extra_body=spec)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and _valid(text, PERSON)["city"] == "Lagos"
    assert r.usage.model_extra["accepted_tokens"] > 0
    off = _post(server, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": 96,
                                                  "response_format": fmt, "speculative": False}).json()
    assert off["choices"][0]["message"]["content"] == text
    streamed = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=96,
                                              response_format=fmt, stream=True, extra_body=spec)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    body = {"prompt": "A JSON object describing a dog:", "max_tokens": 24, "temperature": 0}
    r = _post(server, "/v1/completions", {**body, "response_format": {"type": "json_object"}, **spec}).json()
    assert r["choices"][0]["text"].startswith("{")
    plain = _post(server, "/v1/completions", body).json()
    text_fmt = _post(server, "/v1/completions", {**body, "response_format": {"type": "text"}}).json()
    assert text_fmt["choices"][0]["text"] == plain["choices"][0]["text"]


@pytest.mark.parametrize("fmt, fragment", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}, "invalid json schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
     "unclosed group"),
    ({"type": "json_schema"}, "needs a json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "xml"}, "response_format"),
    ({"type": "json_object", "extra": 1}, "response_format"),
])
def test_server_bad_response_format(server, fmt, fragment):
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                               "response_format": fmt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and "\n" not in err["message"], err


def test_bench_prompts_and_summary():
    from speculative.bench.constrained import load_prompts, markdown, summarize, valid_under

    rows = load_prompts()
    assert len(rows) >= 10 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        jsonschema.Draft202012Validator.check_schema(r["schema"])
        ConstraintSpec.json_schema(r["schema"]).validate()
    assert valid_under('{"a": 1}', {"type": "object", "required": ["a"]})
    assert not valid_under('{"a": 1', {"type": "object"}) and not valid_under("{}", {"required": ["a"]})
    runs = [{"prompt": p, "method": m, "new_tokens": 11, "decode_s": s, "steps": st, "draft_tokens": d,
             "accepted_tokens": a, "cut_tokens": 0, "valid": True, "identical": True}
            for p, m, s, st, d, a in [("x", "none", 2.0, 11, 0, 0), ("x", "ngram", 1.0, 6, 8, 5),
                                      ("y", "none", 4.0, 11, 0, 0), ("y", "ngram", 1.0, 3, 12, 8)]]
    s = summarize(runs, ["none", "ngram"], target="t", k=4, max_new_tokens=16, draft_policy="fixed")
    ngram = s["methods"][1]
    assert ngram["speedup_geomean"] == pytest.approx(8 ** 0.5) and ngram["speedup"] == pytest.approx(3.0)
    assert ngram["tau"] == pytest.approx(20 / 7) and "2.83x" in markdown(s)


@pytest.mark.transformers
def test_transformers_tokenizer_gives_the_same_masks(smol):
    """The transformers backend's constraint (built from the fast tokenizer's JSON) masks exactly as llama.cpp's
    (built from the GGUF vocabulary's token bytes), and constrained generation there validates."""
    pytest.importorskip("transformers")
    from speculative.backends import load_backend

    hf = load_backend("smollm2-135m-instruct", "transformers", n_ctx=512)
    try:
        for spec, text in ((ConstraintSpec.json_schema(PERSON), '{\n  "name": "Ana", "age": 3'),
                           (ConstraintSpec.regex("[1-4]{3}"), "12")):
            a, b = Constraint.compile(spec, smol), Constraint.compile(spec, hf)
            for t in [None] + smol.encode(text, add_special=False):
                if t is not None:
                    a.consume(t)
                    b.consume(t)
                assert np.array_equal(a.mask(), b.mask()), f"{spec.kind}: masks differ after {text!r}"
        gen = SpeculativeGenerator(hf, build_drafter("ngram", hf))
        r = gen.generate(EXTRACT[0], json_schema=PERSON, max_new_tokens=96, num_speculative_tokens=4,
                         draft_policy="fixed")
        assert r.finish_reason == "stop" and _valid(r.text, PERSON)["age"] == 34
    finally:
        hf.close()
