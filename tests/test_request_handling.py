"""Request handling as a new user meets it (issue 14, part 3): the context window, invalid text, request
fields honoured or refused by name, strict types, min_tokens under speculation, the CLI's sampling options.

Each case runs through the CLI (a subprocess, so a native abort would show as such) and the server (raw
HTTP on a loopback port), with and without speculation, on SmolLM2-135M-Instruct. Speculation that
verifies many tokens per step is forced with the target as its own draft model and the fixed draft
policy (k = 8: every draft token is accepted under greedy decoding unless verification rejects it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from conftest import InProcessServer
from speculative.engine import SpeculativeGenerator
from speculative.errors import ConfigError, ContextOverflowError
from speculative.sampling import Sampler

MODEL = "smollm2-135m-instruct"
SELF_DRAFT = f"model:{MODEL}"
COUNT = "one two three four five six seven eight nine ten "
YES_NO = "Reply with exactly one word: yes or no. Is fire hot?"
CTX = 600


def cli(*argv, stdin: bytes | None = None, timeout: int = 300):
    """Run ``speculative`` in a subprocess: (exit status, stdout, stderr)."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "0"}
    r = subprocess.run([sys.executable, "-m", "speculative.cli", *argv], input=stdin, capture_output=True,
                       timeout=timeout, env=env)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def one_line_error(result: tuple[int, str, str], fragment: str) -> None:
    code, _, err = result
    assert code == 2, (code, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in err and "GGML" not in err


@pytest.fixture(scope="module")
def long_prompt(smol) -> tuple[str, int]:
    """Raw text of more than 512 tokens (llama.cpp's default batch: fed in chunks) that fits in CTX."""
    text = COUNT * 56
    n = len(smol.encode(text))
    assert 512 < n < CTX - 20, n
    return text, n


# ---- the context window: CLI -------------------------------------------------------------------


@pytest.mark.quick
def test_cli_prompt_longer_than_the_window_is_one_line():
    # used to abort in llama.cpp (GGML_ASSERT n_tokens_all <= n_batch) with a core dump
    one_line_error(cli("generate", "Hi", "--ctx-size", "1", "--max-new-tokens", "4"), "context window is 1")
    one_line_error(cli("generate", "Describe the sea. " * 30, "--ctx-size", "128", "--max-new-tokens", "4"),
                   "context window is 128")


def test_cli_fills_the_window_then_stops_with_length(long_prompt):
    """A prompt that fits generates until prompt + output = --ctx-size, with or without speculation."""
    text, n = long_prompt
    outs = {}
    for drafter in ("none", SELF_DRAFT):
        code, out, err = cli("generate", text, "--no-chat", "--ctx-size", str(CTX), "--max-new-tokens", "500",
                             "--json", "--drafter", drafter, "--draft-policy", "fixed", "--k", "8")
        assert code == 0, err[-2000:]
        obj = json.loads(out)
        assert obj["finish_reason"] == "length"
        assert n + len(obj["token_ids"]) == CTX, (drafter, n, len(obj["token_ids"]))
        outs[drafter] = obj
    assert outs["none"]["token_ids"] == outs[SELF_DRAFT]["token_ids"]
    assert outs[SELF_DRAFT]["stats"]["accepted_tokens"] > 0


_BACKEND_PROBE = """
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
from speculative.errors import ContextOverflowError
b = load_backend("smollm2-135m-instruct", n_ctx=40, max_sequences=2)
ids = b.encode("one two three four five six seven eight nine ten " * 8, add_special=False)
assert b.n_ctx == 40 and b._batch_cap <= 80, (b.n_ctx, b._batch_cap)
b.forward([ForwardRequest(1, ids[:40], logits="last")])  # the whole window in one call
try:
    b.forward([ForwardRequest(0, ids[:41], logits="last")])  # llama.cpp holds 256 cells: this used to abort
    raise SystemExit("no ContextOverflowError")
except ContextOverflowError:
    pass
print("ok")
"""


@pytest.mark.quick
def test_backend_window_is_the_one_asked_for():
    """llama.cpp pads a context to 256 cells but caps a decode call at the size asked for: the backend's
    window is what was asked for, so a longer input is refused instead of aborting the process."""
    r = subprocess.run([sys.executable, "-c", _BACKEND_PROBE], capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout.decode().strip().endswith("ok"), r.stderr.decode()[-2000:]


# ---- invalid text: CLI --------------------------------------------------------------------------


@pytest.mark.quick
def test_cli_stdin_that_is_not_utf8():
    code, out, err = cli("generate", "-", stdin=b"ab\xff\xfe cd\n")
    one_line_error((code, out, err), "not valid UTF-8")
    assert "0xff at offset 2" in err and not out


@pytest.mark.quick
def test_cli_prompt_argument_that_is_not_utf8():
    # the shell passes bytes; Python turns the invalid ones into lone surrogates
    r = subprocess.run([sys.executable, "-m", "speculative.cli", "generate", b"ab\xff cd", "--max-new-tokens", "2"],
                       capture_output=True, timeout=300)
    one_line_error((r.returncode, "", r.stderr.decode()), "not valid Unicode")


# ---- min_tokens, --min-p, --draft-policy: CLI ---------------------------------------------------


def test_cli_min_tokens_with_and_without_speculation():
    base = ["generate", YES_NO, "--json", "--max-new-tokens", "40"]
    code, out, err = cli(*base, "--drafter", "none")
    assert code == 0, err
    short = json.loads(out)
    assert short["finish_reason"] == "stop" and len(short["token_ids"]) < 10
    m = len(short["token_ids"]) + 8
    runs = []
    for extra in (["--drafter", "none"], ["--drafter", SELF_DRAFT, "--draft-policy", "fixed", "--k", "8"]):
        code, out, err = cli(*base, "--min-tokens", str(m), *extra)
        assert code == 0, err
        runs.append(json.loads(out))
    plain, spec = runs
    assert spec["token_ids"] == plain["token_ids"]
    assert len(plain["token_ids"]) > m - 1 and plain["token_ids"][: m - 1] != short["token_ids"]
    assert spec["stats"]["accepted_tokens"] > 0
    one_line_error(cli(*base, "--min-tokens", "50"), "min_tokens")


def test_cli_min_p_and_draft_policy():
    """--min-p and --draft-policy reach the engine: sampling at temperature 1.5 with speculation (the fixed
    policy: every draft verified), every emitted token is one min-p allows at its position (probability at
    least 0.2 times the most likely token's; without min-p most tokens here are not), and drafts were
    verified. A bad value is a one-line error."""
    from conftest import next_logits_fresh
    from speculative.config import SamplingParams

    base = ["generate", "Name three colors.", "--json", "--max-new-tokens", "24", "--temperature", "1.5",
            "--seed", "4", "--min-p", "0.2"]
    code, out, err = cli(*base, "--drafter", SELF_DRAFT, "--draft-policy", "fixed")
    assert code == 0, err
    res = json.loads(out)
    assert res["token_ids"] and res["stats"]["draft_tokens"] > 0
    gen = SpeculativeGenerator.from_pretrained(MODEL, drafter=None, n_ctx=CTX)
    try:
        ids = gen.encode_prompt("Name three colors.")
        allowed = Sampler(SamplingParams(temperature=1.5, min_p=0.2))
        for i, tok in enumerate(res["token_ids"]):
            assert allowed.probs(next_logits_fresh(gen.target, ids + res["token_ids"][:i]))[tok] > 0, i
    finally:
        gen.close()
    one_line_error(cli(*base, "--min-p", "1.5"), "min_p")
    code, _, err = cli(*base, "--draft-policy", "greedy")
    assert code == 2 and "invalid choice" in err  # argparse's own message


# ---- the Python API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen():
    g = SpeculativeGenerator.from_pretrained(MODEL, drafter=SELF_DRAFT, n_ctx=CTX)
    yield g
    g.close()


def test_api_window_and_invalid_text(gen, long_prompt):
    text, n = long_prompt
    with pytest.raises(ContextOverflowError, match="context window"):
        gen.generate(text * 2, chat=False)
    r = gen.generate(text, chat=False, max_new_tokens=500, draft_policy="fixed")
    assert r.finish_reason == "length" and n + len(r.token_ids) == CTX
    with pytest.raises(ConfigError, match="not valid Unicode"):
        gen.generate("a\ud800b", max_new_tokens=2)
    with pytest.raises(ConfigError, match="min_tokens"):
        gen.generate("Hi", max_new_tokens=4, min_tokens=5)


class _MaskRowZeroOnly(Sampler):
    """A deliberately wrong min_tokens: only the first row of a verification block is masked."""

    def adjust(self, logits, history, draft):
        if logits.shape[0] <= 1:
            return super().adjust(logits, history, draft)
        return np.concatenate([super().adjust(logits[:1], history, ()), logits[1:]])


@pytest.mark.quick
def test_api_min_tokens_speculative_equals_plain_and_a_wrong_mask_is_caught(gen, monkeypatch):
    short = gen.generate(YES_NO, max_new_tokens=40, speculative=False)
    assert short.finish_reason == "stop"
    m = len(short.token_ids) + 10
    plain = gen.generate(YES_NO, max_new_tokens=40, min_tokens=m, speculative=False)
    spec = gen.generate(YES_NO, max_new_tokens=40, min_tokens=m, draft_policy="fixed", num_speculative_tokens=8)
    assert spec.token_ids == plain.token_ids and spec.stats.accepted_tokens > 0
    eos = gen.target.eos_token_ids
    assert len(plain.token_ids) >= m and not any(t in eos for t in plain.token_ids[:m])
    # the same comparison fails when verified positions past the first are not masked
    monkeypatch.setattr(gen, "make_sampler", lambda cfg, n=0: _MaskRowZeroOnly(
        cfg.sampling, n, min_tokens=cfg.min_tokens, suppress=gen.target.eos_token_ids))
    wrong = gen.generate(YES_NO, max_new_tokens=40, min_tokens=m, draft_policy="fixed", num_speculative_tokens=8)
    assert wrong.token_ids != plain.token_ids


# ---- the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url():
    g = SpeculativeGenerator.from_pretrained(MODEL, drafter=SELF_DRAFT, n_ctx=CTX, max_sequences=2)
    srv = InProcessServer(g, MODEL)
    yield srv.url
    srv.close()
    g.close()


SPEC = {"num_speculative_tokens": 8, "draft_policy": "fixed"}
OFF = {"speculative": False}


def post(url, path, body):
    return httpx.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=300)


def stream(url, path, body):
    """(status, text, finish_reason, usage) of a streamed request."""
    pieces, finish, usage = [], None, None
    with httpx.stream("POST", url + path, content=json.dumps({**body, "stream": True,
                                                                "stream_options": {"include_usage": True}}),
                      headers={"content-type": "application/json"}, timeout=300) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json(), None, None
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            usage = obj.get("usage") or usage
            for ch in obj["choices"]:
                piece = ch.get("text") if "text" in ch else ch.get("delta", {}).get("content")
                pieces.append(piece or "")
                finish = ch.get("finish_reason") or finish
    return 200, "".join(pieces), finish, usage


def text_of(resp: dict) -> str:
    ch = resp["choices"][0]
    return ch["text"] if "text" in ch else ch["message"]["content"]


def test_server_fills_the_window_then_stops_with_length(url, long_prompt):
    text, n = long_prompt
    outs = []
    for extra in (OFF, SPEC):
        r = post(url, "/v1/completions", {"prompt": text, "max_tokens": 10**6, "temperature": 0, **extra})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] == n and body["usage"]["total_tokens"] == CTX
        outs.append(body)
    assert text_of(outs[0]) == text_of(outs[1]) and outs[1]["usage"]["accepted_tokens"] > 0
    status, streamed, finish, usage = stream(url, "/v1/completions",
                                             {"prompt": text, "max_tokens": 10**6, "temperature": 0, **SPEC})
    assert status == 200 and streamed == text_of(outs[0]) and finish == "length" and usage["total_tokens"] == CTX
    # chat without max_tokens: up to the window too (or an earlier end of turn)
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to five."}],
                                              "temperature": 0, "max_tokens": 20, **SPEC}).json()
    assert chat["usage"]["completion_tokens"] <= 20


@pytest.mark.quick
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("streamed", [False, True])
def test_server_prompt_longer_than_the_window(url, long_prompt, path, streamed):
    text = long_prompt[0] * 2
    body = {"prompt": text} if path == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    if streamed:
        status, err, _, _ = stream(url, path, body)
    else:
        r = post(url, path, body)
        status, err = r.status_code, r.json()
    assert status == 400
    assert err["error"]["code"] == "context_length_exceeded" and "context window" in err["error"]["message"]


SURROGATE_BODIES = [
    ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 4}, "prompt"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 4, "stop": ["x\udc00"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 4}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}],
                              "max_tokens": 4}, "messages"),
]


@pytest.mark.quick
@pytest.mark.parametrize("path, body, param", SURROGATE_BODIES)
@pytest.mark.parametrize("streamed", [False, True])
def test_server_lone_surrogates_are_400(url, path, body, param, streamed):
    if streamed:
        status, err, _, _ = stream(url, path, body)
    else:
        r = post(url, path, body)  # json.dumps escapes the surrogate as \ud800, as a client would send it
        status, err = r.status_code, r.json()
    assert status == 400, err
    assert "not valid Unicode" in err["error"]["message"] and err["error"]["param"].startswith(param)
    if isinstance(body.get("messages", [{}])[0].get("content"), list):  # a text part: the error names it
        assert err["error"]["message"].startswith("messages[0].content part 0: not valid Unicode")


REFUSED = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"n": 2}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"suffix": "end"}, "suffix"),
    ({"echo": True}, "echo"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"logprobs_mode": "raw"}, "logprobs_mode"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": float("inf")}, "top_p"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 4.0}, "max_tokens"),
    ({"speculative": "no"}, "speculative"),
    ({"stream": 1}, "stream"),
    ({"temperature": "0.5"}, "temperature"),
    ({"seed": "7"}, "seed"),
    ({"logit_bias": {"13": "5"}}, "logit_bias.13"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true (as OpenAI, vLLM)
]


@pytest.mark.quick
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("extra, param", REFUSED, ids=[p for _, p in REFUSED])
def test_server_refuses_fields_it_does_not_honour_by_name(url, path, extra, param):
    # best_of, suffix and echo are completions fields: unknown to chat, refused all the same
    body = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
    r = post(url, path, {**body, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
    if any(isinstance(v, float) and not math.isfinite(v) for v in extra.values()):
        assert "must be a finite number" in err["message"]


@pytest.mark.quick
def test_server_prompt_batch_forms_and_bodies_that_are_not_json(url):
    base = {"max_tokens": 4, "temperature": 0}
    want = text_of(post(url, "/v1/completions", {**base, "prompt": "The sky is"}).json())
    # OpenAI's batch forms holding one prompt are that prompt
    assert text_of(post(url, "/v1/completions", {**base, "prompt": ["The sky is"]}).json()) == want
    r = post(url, "/v1/completions", {**base, "prompt": [[504, 6205, 314]]})
    assert r.status_code == 200 and len(text_of(r.json())) > 0, r.text
    # several prompts: refused by name, not with a type error about integers
    r = post(url, "/v1/completions", {**base, "prompt": ["a", "b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "batch of 2 prompts" in r.json()["error"]["message"]
    r = post(url, "/v1/completions", {**base, "prompt": [[1, 2], [3]]})
    assert r.status_code == 400 and "batch of 2 prompts" in r.json()["error"]["message"]
    # a JSON body sent without a JSON content type, a body that is not an object, no body
    r = httpx.post(url + "/v1/completions", content=json.dumps({**base, "prompt": "x"}), timeout=60)
    assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"], r.text
    r = post(url, "/v1/chat/completions", [{"role": "user", "content": "hi"}])
    assert r.status_code == 400 and r.json()["error"]["message"] == "the request body must be a JSON object"
    r = httpx.post(url + "/v1/completions", timeout=60)
    assert r.status_code == 400 and "body is missing" in r.json()["error"]["message"], r.text


@pytest.mark.quick
def test_server_refused_messages_fields(url):
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}]
    r = post(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.tool_calls"
    r = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi", "weight": 2}],
                                           "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.weight"


@pytest.mark.quick
def test_server_accepts_and_ignores_what_changes_nothing(url):
    ignored = {"user": "u1", "metadata": {"a": "b"}, "store": False, "n": 1, "service_tier": "auto",
               "parallel_tool_calls": True, "tools": [], "tool_choice": "none", "prompt_cache_key": "k",
               "safety_identifier": "s", "stream_options": None}
    msgs = [{"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue.", "tool_calls": None, "refusal": None, "name": "bot"},
            {"role": "user", "content": "Another one."}]
    base = {"messages": msgs, "max_tokens": 12, "temperature": 0}
    plain = post(url, "/v1/chat/completions", base).json()
    got = post(url, "/v1/chat/completions", {**base, **ignored}).json()
    assert text_of(got) == text_of(plain)
    comp = {"prompt": "The sky is", "max_tokens": 6, "temperature": 0}
    a = post(url, "/v1/completions", comp).json()
    b = post(url, "/v1/completions", {**comp, "best_of": 1, "echo": False, "suffix": None, "user": "u", "n": 1}).json()
    assert text_of(a) == text_of(b)


@pytest.mark.quick
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_server_min_tokens_with_and_without_speculation(url, path):
    if path == "/v1/completions":
        # stop strings count only from the min_tokens-th token on: "," would stop after 2 tokens
        body = {"prompt": "Counting in words: one, two, three, four,", "stop": [","], "temperature": 0,
                "max_tokens": 40, "logprobs": 1}
    else:
        body = {"messages": [{"role": "user", "content": YES_NO}], "temperature": 0, "max_tokens": 40,
                "logprobs": True}
    short = post(url, path, {**body, **OFF}).json()
    n = short["usage"]["completion_tokens"]
    assert short["choices"][0]["finish_reason"] == "stop" and n < 8
    m = n + 6
    plain = post(url, path, {**body, "min_tokens": m, **OFF}).json()
    spec = post(url, path, {**body, "min_tokens": m, **SPEC}).json()
    assert plain["choices"][0]["logprobs"] == spec["choices"][0]["logprobs"]
    assert text_of(plain) == text_of(spec)
    assert plain["choices"][0]["finish_reason"] == spec["choices"][0]["finish_reason"]
    assert spec["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] >= m
    assert spec["usage"]["accepted_tokens"] > 0 and text_of(plain) != text_of(short)
    status, streamed, finish, _ = stream(url, path, {**body, "min_tokens": m, **SPEC})
    assert status == 200 and streamed == text_of(spec) and finish == spec["choices"][0]["finish_reason"]


@pytest.mark.quick
def test_from_pretrained_without_a_drafter_decodes_plainly():
    from speculative.drafters.base import NoDrafter

    with SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter=None, n_ctx=256) as gen:
        assert isinstance(gen.drafter, NoDrafter)
        r = gen.generate("Hi", max_new_tokens=3)
        assert 1 <= len(r.token_ids) <= 3 and r.stats.steps == len(r.token_ids)  # one token per step
