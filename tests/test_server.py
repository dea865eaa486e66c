"""The OpenAI-compatible server, driven by the real ``openai`` client and raw HTTP on a loopback port.

Multi-token steps are forced with the target as its own draft model and the
fixed draft policy (every step verifies k = 8 draft tokens, all accepted under
greedy), and every case is compared with the same request with speculation off.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import InProcessServer
from speculative.engine import SpeculativeGenerator

MODEL = "smollm2-135m-instruct"
SPEC = {"num_speculative_tokens": 8, "draft_policy": "fixed"}
OFF = {"speculative": False}


@pytest.fixture(scope="module")
def server():
    gen = SpeculativeGenerator.from_pretrained(MODEL, drafter=f"model:{MODEL}", n_ctx=2048, max_sequences=8)
    srv = InProcessServer(gen, MODEL)
    yield srv.url, srv.state
    srv.close()
    gen.close()


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(url, path, body, timeout=120):
    return httpx.post(url + path, json=body, timeout=timeout)


def chat(url, content, **kw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def comp(url, prompt, **kw):
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, **kw}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def tokens_of(resp):
    lp = resp["choices"][0]["logprobs"]
    return lp["content"] if "content" in lp else lp


def same(a, b):
    """Text, finish reason, and every log-probability equal (tokens included)."""
    assert a["choices"][0].get("text", a["choices"][0].get("message", {}).get("content")) == \
        b["choices"][0].get("text", b["choices"][0].get("message", {}).get("content"))
    assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
    assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]


# ---- endpoints -------------------------------------------------------------------------


@pytest.mark.quick
def test_models_health_and_openai_client(server, client):
    url, _ = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=12, temperature=0, extra_body=SPEC)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 12
    assert r.usage.model_extra["draft_tokens"] > 0 and r.usage.model_extra["accepted_tokens"] > 0
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert c.choices[0].text and c.usage.prompt_tokens > 0


@pytest.mark.quick
def test_multi_turn_chat_reuses_the_prompt_prefix(server):
    url, _ = server
    msgs = [{"role": "user", "content": "Name a large animal that lives in the ocean."}]
    first = post(url, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 20, "temperature": 0}).json()
    msgs += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "How big can it get?"}]
    second = post(url, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 20, "temperature": 0}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]  # the first turn's prompt was not recomputed
    assert cached < second["usage"]["prompt_tokens"]


@pytest.mark.quick
def test_metrics_count_speculation(server):
    url, _ = server
    chat(url, "List three fruits.", max_tokens=24, **SPEC)
    text = httpx.get(url + "/metrics").text
    for name in ("speculative_steps_total", "speculative_draft_tokens_total", "speculative_accepted_tokens_total",
                 "speculative_accepted_tokens_per_position_total", "speculative_tokens_per_second",
                 "speculative_requests_total"):
        assert name in text, name
    acc = [ln for ln in text.splitlines() if ln.startswith("speculative_accepted_tokens_total")]
    assert float(acc[0].split()[-1]) > 0


# ---- exact semantics of multi-token steps -------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    "params",
    [
        {"presence_penalty": 1.2, "frequency_penalty": 0.8},
        {"repetition_penalty": 1.3},
        {"logit_bias": {"13": -100, "28": 5.0}},
        {"frequency_penalty": -0.5, "repetition_penalty": 0.9},
    ],
)
def test_penalties_match_speculation_off(server, params):
    url, _ = server
    prompt = "Write a list of ten animals, one per line, and repeat the list twice."
    a = chat(url, prompt, max_tokens=60, logprobs=True, top_logprobs=3, **params, **SPEC)
    b = chat(url, prompt, max_tokens=60, logprobs=True, top_logprobs=3, **params, **OFF)
    assert a["usage"]["accepted_tokens"] > 0 and b["usage"]["draft_tokens"] == 0
    same(a, b)


def test_penalties_change_the_output(server):
    url, _ = server
    prompt = "Write a list of ten animals, one per line, and repeat the list twice."
    plain = chat(url, prompt, max_tokens=60, **SPEC)["choices"][0]["message"]["content"]
    pen = chat(url, prompt, max_tokens=60, frequency_penalty=1.5, **SPEC)["choices"][0]["message"]["content"]
    assert plain != pen  # the penalties test above compares something that matters


COUNTING = "Counting in words: one, two, three, four,"


@pytest.mark.quick
def test_stop_string_inside_an_accepted_block(server):
    url, _ = server
    full = comp(url, COUNTING, max_tokens=40, logprobs=1, **OFF)
    text = full["choices"][0]["text"]
    stop = "even"  # completes inside the token " seven", in the middle of an 8-token block
    assert stop in text
    a = comp(url, COUNTING, max_tokens=40, stop=[stop, "zzz"], logprobs=1, **SPEC)
    b = comp(url, COUNTING, max_tokens=40, stop=[stop, "zzz"], logprobs=1, **OFF)
    same(a, b)
    assert a["usage"]["accepted_tokens"] > 0
    got = a["choices"][0]
    assert got["finish_reason"] == "stop" and got["text"] == text[: text.index(stop)]
    # token ids and logprobs end at the token that completed the stop string
    toks = got["logprobs"]["tokens"]
    assert "".join(toks).endswith(" seven") and "".join(toks[:-1]) == got["text"].rstrip("s")[: len("".join(toks[:-1]))]
    assert a["usage"]["completion_tokens"] == len(toks) < full["usage"]["completion_tokens"]


def test_stop_and_eos_win_over_max_tokens(server):
    url, _ = server
    prompt = "Reply with exactly one word: yes or no. Is fire hot?"
    full = chat(url, prompt, max_tokens=64, **OFF)
    n = full["usage"]["completion_tokens"]
    assert full["choices"][0]["finish_reason"] == "stop" and n < 64
    # EOS accepted mid-block (k = 8 covers the whole answer); max_tokens just above it
    for m in (n, n + 1, n + 3):
        a = chat(url, prompt, max_tokens=m, logprobs=True, **SPEC)
        b = chat(url, prompt, max_tokens=m, logprobs=True, **OFF)
        same(a, b)
        assert a["choices"][0]["finish_reason"] == "stop"
    c = chat(url, prompt, max_tokens=n - 1, **SPEC)
    assert c["choices"][0]["finish_reason"] == "length" and c["usage"]["completion_tokens"] == n - 1
    # a stop string completed before max_tokens, in the same block
    t2 = comp(url, COUNTING, max_tokens=6, **OFF)
    assert "seven" in t2["choices"][0]["text"]
    a = comp(url, COUNTING, max_tokens=6, stop=["seven"], **SPEC)
    assert a["choices"][0]["finish_reason"] == "stop"
    assert a["choices"][0]["text"] == t2["choices"][0]["text"].split("seven")[0]


def _stream(url, path, body):
    pieces, finish, usage, lps = [], None, None, []
    with httpx.stream("POST", url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                      timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj["choices"]:
                piece = ch.get("text") if "text" in ch else ch.get("delta", {}).get("content")
                if piece:
                    pieces.append(piece)
                if ch.get("logprobs"):
                    lp = ch["logprobs"]
                    lps.extend(lp["content"] if "content" in lp else lp["token_logprobs"])
                finish = ch.get("finish_reason") or finish
    return "".join(pieces), finish, usage, lps


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": COUNTING, "max_tokens": 60, "stop": ["twelve"]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Écris une phrase en français sur les éléphants, avec des accents et un emoji 🐘."}],
                                  "max_tokens": 48}),
        ("/v1/completions", {"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 40,
                             "stop": [" the", "\n\n"], "logprobs": 2}),
    ],
)
def test_streaming_concatenates_to_the_non_stream_text(server, path, body):
    url, _ = server
    body = {"model": MODEL, "temperature": 0, **body, **SPEC}
    text, finish, usage, lps = _stream(url, path, body)
    full = post(url, path, body).json()
    ch = full["choices"][0]
    assert text == ch.get("text", ch.get("message", {}).get("content"))
    assert finish == ch["finish_reason"]
    assert usage["completion_tokens"] == full["usage"]["completion_tokens"]
    off = post(url, path, {**body, **OFF}).json()["choices"][0]
    assert ch.get("text", ch.get("message")) == off.get("text", off.get("message"))
    assert ch["finish_reason"] == off["finish_reason"]


@pytest.mark.quick
def test_logprobs_equal_plain_run_in_completions(server):
    url, _ = server
    a = comp(url, "The three primary colors are", max_tokens=30, logprobs=5, **SPEC)
    b = comp(url, "The three primary colors are", max_tokens=30, logprobs=5, **OFF)
    same(a, b)
    lp = a["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == a["usage"]["completion_tokens"]
    assert all(x <= 0 for x in lp["token_logprobs"]) and all(len(t) == 5 for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == a["choices"][0]["text"]


def test_sampling_with_seed_is_reproducible_and_isolated(server):
    url, _ = server
    kw = dict(max_tokens=40, temperature=0.9, top_p=0.95, seed=7, **SPEC)
    a = chat(url, "Tell me a short story about a cat.", **kw)
    b = chat(url, "Tell me a short story about a cat.", **kw)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    c = chat(url, "Tell me a short story about a cat.", **{**kw, "seed": 8})
    assert c["choices"][0]["message"]["content"] != a["choices"][0]["message"]["content"]


# ---- concurrency ------------------------------------------------------------------------------

PROMPTS = [
    "Name five countries in Europe.",
    "What is two plus two? Explain.",
    "Write a haiku about the sea.",
    "List the days of the week.",
    "Describe a rainbow in one sentence.",
    "Give three tips for sleeping well.",
    "What does a bee do?",
    "Translate 'good morning' to Spanish and French.",
]


def test_eight_concurrent_greedy_clients_equal_their_solo_runs(server):
    url, _ = server
    solo = [chat(url, p, max_tokens=40, **SPEC)["choices"][0]["message"]["content"] for p in PROMPTS]

    def one(i):
        # mixed settings: speculation on/off, other requests sampling with penalties and seeds
        extra = SPEC if i % 2 == 0 else {"num_speculative_tokens": 3}
        return chat(url, PROMPTS[i], max_tokens=40, **extra)["choices"][0]["message"]["content"]

    def noisy(i):
        return chat(url, PROMPTS[i], max_tokens=30, temperature=1.2, seed=i, presence_penalty=1.0, **SPEC)

    with ThreadPoolExecutor(12) as ex:
        futs = [ex.submit(one, i) for i in range(8)] + [ex.submit(noisy, i) for i in range(4)]
        outs = [f.result() for f in futs[:8]]
        for f in futs[8:]:
            f.result()
    assert outs == solo


@pytest.mark.quick
def test_disconnect_frees_the_slot(server):
    url, state = server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a very long essay about oceans."}],
            "max_tokens": 1500, "temperature": 0, "stream": True, **OFF}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if '"content"' in line:
                break
    t0 = time.time()
    while time.time() - t0 < 5:
        running, _ = state.scheduler.load()
        if running == 0:
            break
        time.sleep(0.05)
    assert state.scheduler.load()[0] == 0, "the disconnected request still holds its slot"
    assert time.time() - t0 < 2.0
    # non-streaming request whose client gives up
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=0.5)
    t0 = time.time()
    while state.scheduler.load()[0] and time.time() - t0 < 5:
        time.sleep(0.05)
    assert state.scheduler.load()[0] == 0


# ---- bad requests ------------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    "path, raw, status, fragment",
    [
        ("/v1/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/completions", {"prompt": 12}, 400, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens must be >= 1"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400,
         "max_tokens must be >= 1"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "word " * 3000}, 400, "context"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "n": 3}, 400, "n"),
        ("/v1/completions", {"prompt": [999999999]}, 400, "token ids"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
         400, "messages[0].content part 0: unknown field(s) 'x'"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
         "messages[0].content part 0: 'text' must be a string"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         400, 'messages[0].content part 0 has type "image_url"'),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, 400, "an empty list of parts"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0]: a user message needs content"),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "input_audio"}]}]}, 400, 'messages[1].content part 1 has type'),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, 400, "a user message needs content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, 400, "logprobs"),
        ("/v1/nope", {}, 404, "Not Found"),
    ],
)
def test_bad_requests_get_openai_errors(server, path, raw, status, fragment):
    url, _ = server
    if isinstance(raw, bytes):
        r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"})
    else:
        r = httpx.post(url + path, json=raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"]
    assert httpx.get(url + "/health").status_code == 200  # still serving


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.integers(-(10**12), 10**12),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))


def _containers(children):
    return st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)


_values = st.recursive(_scalars, _containers, max_leaves=6)
_fields = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
           "stream", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "logit_bias", "num_speculative_tokens", "speculative", "draft_policy", "stream_options", "echo"]


@pytest.mark.quick
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    body=st.dictionaries(st.sampled_from(_fields), _values, max_size=8),
    good_prompt=st.booleans(),
    tokens=st.integers(-3, 6),  # a larger max_tokens is valid (generation stops at the window): too slow here
)
def test_fuzzed_bodies_never_5xx(server, path, body, good_prompt, tokens):
    url, _ = server
    if good_prompt:  # reach the deeper validation and the generation path too
        body = dict(body)
        body["prompt" if path == "/v1/completions" else "messages"] = (
            "Hello" if path == "/v1/completions" else [{"role": "user", "content": "Hello"}]
        )
    body["max_tokens"] = tokens  # bounded: fuzzing must not start long generations
    body.pop("stream", None)
    # json.dumps writes NaN/Infinity as bare words: non-standard JSON the server must reject cleanly
    r = httpx.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert "error" in r.json()
