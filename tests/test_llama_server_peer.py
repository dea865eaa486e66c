"""The llama-server peers (command lines, /completion parsing, process handling through a stand-in
server) and the report's headline against the fastest plain decoding. llama.cpp is never built here."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from types import SimpleNamespace

import pytest

from speculative.bench.datasets import Question
from speculative.bench.llama_server import (
    VARIANTS,
    completion_request,
    parse_completion,
    server_command,
)
from speculative.bench.report import aggregate, markdown
from speculative.bench.runner import BenchConfig, peer_draft_default
from speculative.cli import main
from speculative.config import GenerationConfig, SamplingParams
from speculative.errors import BackendUnavailableError, ConfigError


def test_server_command_lines():
    plain = server_command("/bin/llama-server", "/m/t.gguf", 4242, 4096, 2)
    assert plain[:3] == ["/bin/llama-server", "-m", "/m/t.gguf"]
    flags = dict(zip(plain[1::2], plain[2::2]))
    assert flags["--port"] == "4242" and flags["--host"] == "127.0.0.1" and flags["-c"] == "4096"
    assert flags["-t"] == "2" and flags["-tb"] == "2" and flags["-np"] == "1" and flags["-cram"] == "0"
    assert "--model-draft" not in plain and "--spec-type" not in plain
    spec = server_command("llama-server", "t.gguf", 1, 512, 4, draft="d.gguf", spec_flags=VARIANTS["llama-server-spec"])
    tail = spec[spec.index("--model-draft"):]
    assert tail == ["--model-draft", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "16",
                    "--spec-draft-n-min", "5", "--spec-draft-p-min", "0.9"]
    # llama.cpp's defaults still need the type named: --model-draft alone drafts nothing in this version
    dflt = server_command("llama-server", "t.gguf", 1, 512, 4, draft="d.gguf", spec_flags=VARIANTS["llama-server-spec-defaults"])
    assert dflt[dflt.index("--model-draft"):] == ["--model-draft", "d.gguf", "--spec-type", "draft-simple"]
    with pytest.raises(ConfigError, match="draft model"):
        server_command("llama-server", "t.gguf", 1, 512, 4, spec_flags=VARIANTS["llama-server-spec"])


def test_completion_request_and_parsing():
    cfg = GenerationConfig(max_new_tokens=7, sampling=SamplingParams(0.0, 0, 1.0, 3))
    body = completion_request([1, 2, 3], cfg, cache_prompt=False)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 7 and body["temperature"] == 0.0
    assert body["cache_prompt"] is False and body["return_tokens"] is True and body["stream"] is False
    assert body["seed"] == 3 and body["repeat_penalty"] == 1.0 and body["min_p"] == 0.0
    # a response of llama-server with a draft model (shape of tools/server, this llama.cpp version)
    canned = {
        "index": 0, "content": " def f(x):\n    return x", "tokens": [707, 282, 2075], "id_slot": 0, "stop": True,
        "tokens_predicted": 3, "tokens_evaluated": 21, "stop_type": "eos", "tokens_cached": 23,
        "timings": {"cache_n": 0, "prompt_n": 21, "prompt_ms": 312.5, "prompt_per_token_ms": 14.9,
                    "prompt_per_second": 67.2, "predicted_n": 3, "predicted_ms": 150.0,
                    "predicted_per_token_ms": 50.0, "predicted_per_second": 20.0, "draft_n": 16, "draft_n_accepted": 11},
    }
    r = parse_completion(canned)
    assert r.tokens == [707, 282, 2075] and r.text.startswith(" def f") and r.n_tokens == 3
    assert r.prompt_ms == 312.5 and r.predicted_ms == 150.0 and (r.draft_n, r.draft_n_accepted) == (16, 11)
    plain = dict(canned, timings={k: v for k, v in canned["timings"].items() if not k.startswith("draft")})
    assert (parse_completion(plain).draft_n, parse_completion(plain).draft_n_accepted) == (0, 0)
    with pytest.raises(BackendUnavailableError, match="context size"):
        parse_completion({"error": {"code": 400, "message": "the request exceeds the available context size"}})
    with pytest.raises(BackendUnavailableError, match="timings"):
        parse_completion({"content": "x"})


def test_peer_draft_defaults_to_the_first_draft_model():
    assert peer_draft_default(["ngram", "model:qwen2.5-coder-0.5b-instruct,ctx=512", "model:other"]) == "qwen2.5-coder-0.5b-instruct"
    assert peer_draft_default(["ngram", "eagle:smollm2-135m-instruct-eagle"]) is None


def test_config_field_added_later_keeps_old_run_folders():
    # the folder name (config hash) of a run recorded before --peer-draft existed is unchanged
    assert BenchConfig().key() == BenchConfig(peer_draft=None).key()
    assert BenchConfig(peer_draft="x").key() != BenchConfig().key()


_FAKE_SERVER = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
with open(os.environ["FAKE_LLAMA_LOG"], "a") as f:
    f.write(json.dumps({"argv": argv, "pid": os.getpid()}) + "\n")
spec = "--model-draft" in argv
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(os.environ["FAKE_LLAMA_LOG"], "a") as f:
            f.write(json.dumps({"request": body}) + "\n")
        t = {"prompt_n": len(body["prompt"]), "prompt_ms": 20.0, "predicted_n": 4, "predicted_ms": 40.0}
        if spec:
            t.update(draft_n=4, draft_n_accepted=2)
        self._send(200, {"content": "four tokens of text", "tokens": [11, 12, 13, 14], "timings": t})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_llama_server_peer_end_to_end_with_a_stand_in_server(tmp_path, monkeypatch):
    """The bench starts the server, waits for /health, drives /completion (cold first turn, cached
    later turns), reads draft counts into acceptance and tau, and stops the server at the end."""
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + _FAKE_SERVER)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("SPECULATIVE_LLAMA_SERVER", str(exe))
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    out = tmp_path / "b"
    code = main(["bench", "--categories", "mt_bench", "qa", "--per-category", "1", "--max-new-tokens", "4",
                 "--no-progress", "--drafter", "ngram", "--peer", "llama-server", "--peer", "llama-server-spec",
                 "--peer-draft", "smollm2-135m-instruct", "--output", str(out)])
    assert code == 0
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    starts = [c for c in calls if "argv" in c]
    assert len(starts) == 2 and sum("--model-draft" in c["argv"] for c in starts) == 1
    reqs = [c["request"] for c in calls if "request" in c]
    assert len(reqs) == 2 * 3  # two servers, MT-Bench (2 turns) + QA (1 turn)
    assert [r["cache_prompt"] for r in reqs].count(True) == 2  # the second MT-Bench turn of each server
    for c in starts:  # stopped (and reaped) at the end
        with pytest.raises(ProcessLookupError):
            os.kill(c["pid"], 0)
    res = json.loads((out / "results.json").read_text())
    by = {m["method"]: m for m in res["methods"]}
    spec = by["llama-server-spec"]
    assert spec["kind"] == "peer" and spec["acceptance_rate"] == pytest.approx(0.5)
    assert spec["draft_tokens"] == 12 and spec["accepted_tokens"] == 6 and spec["new_tokens"] == 12
    assert spec["mean_accepted_tokens"] == pytest.approx(12 / (12 - 6))  # tokens per target step
    assert by["llama-server"]["plain"] and not spec["plain"] and by["baseline"]["plain"]
    assert "acceptance_rate" not in by["llama-server"]
    assert res["fastest_plain"]["plain_methods"] == ["baseline", "llama-server"]
    assert (out / "llama-server-spec.log").is_file()
    md = (out / "results.md").read_text()
    assert "## Against the fastest plain decoding of the target in this run" in md
    assert "| llama-server-spec |" in md


def test_missing_peer_draft_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECULATIVE_LLAMA_SERVER", sys.executable)  # never started: the check comes first
    code = main(["bench", "--categories", "qa", "--per-category", "1", "--max-new-tokens", "2", "--no-progress",
                 "--drafter", "ngram", "--peer", "llama-server-spec", "--output", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "needs a draft model" in err and "Traceback" not in err


def _row(qid, method, wall, prefill, text="a"):
    return {"question_id": qid, "method": method, "new_tokens": 10, "wall_time_s": wall, "prefill_time_s": prefill,
            "stats": None, "turn_token_ids": [[1]], "texts": [text], "compare_by": "text", "rss_peak_mb": 1.0}


def test_headline_is_against_the_fastest_unmodified_plain_decoding():
    # ours plain 10 s per question; llama-server plain 8 s (fastest unmodified end to end) but a slower
    # prefill, so its decoding (6 s) loses to transformers' (5.5 s); our speculative method takes 9 s. The
    # in-process llama-cpp-python peer is faster still (7 s), but it loads our patched library: never the reference.
    qs = [Question(i, c, ("x",)) for i, c in enumerate(["qa", "qa", "code", "code"])]
    methods = [SimpleNamespace(label=lab, kind=kind, k=None, plain=plain, unmodified=unmod)
               for lab, kind, plain, unmod in [
                   ("baseline", "baseline", True, False), ("llama-server", "peer", True, True),
                   ("transformers", "peer", True, True), ("llama-cpp-python (our build)", "peer", True, False),
                   ("ngram", "ours", False, False), ("llama-server-spec", "peer", False, True)]]
    times = {"baseline": (10.0, 1.0), "llama-server": (8.0, 2.0), "transformers": (9.0, 3.5),
             "llama-cpp-python (our build)": (7.0, 1.0), "ngram": (9.0, 1.0), "llama-server-spec": (12.0, 2.0)}
    done = {}
    for q in qs:
        for lab, (w, p) in times.items():
            scale = 1.0 + 0.1 * q.question_id  # questions differ in length; ratios stay paired
            done[(q.question_id, lab)] = _row(q.question_id, lab, w * scale, p * scale)
    runner = SimpleNamespace(cfg=BenchConfig(), questions=qs, methods=methods, load_rss_mb={}, cost_model=None)
    agg = aggregate(runner, done)
    ref = agg["fastest_plain"]
    assert ref["end_to_end"] == "llama-server" and ref["decode"] == "transformers" and ref["unmodified"]
    assert ref["plain_methods"] == ["llama-server", "transformers"]
    by = {m["method"]: m for m in agg["methods"]}
    assert not by["llama-cpp-python (our build)"]["unmodified"] and by["llama-server"]["unmodified"]
    v = by["ngram"]["vs_fastest_plain"]
    assert v["speedup"]["mean"] == pytest.approx(8 / 9) and v["decode_speedup"]["mean"] == pytest.approx(5.5 / 8)
    assert v["speedup_by_category"]["code"] == pytest.approx(8 / 9)
    assert by["ngram"]["speedup"]["mean"] == pytest.approx(10 / 9)  # the per-baseline figures stay
    assert by["llama-server"]["vs_fastest_plain"]["speedup"]["mean"] == pytest.approx(1.0)
    assert by["baseline"]["vs_fastest_plain"]["speedup"]["mean"] == pytest.approx(0.8)
    assert by["llama-cpp-python (our build)"]["vs_fastest_plain"]["speedup"]["mean"] == pytest.approx(8 / 7)
    lo, hi = v["speedup"]["ci95"]
    assert lo == pytest.approx(8 / 9) and hi == pytest.approx(8 / 9)  # identical ratios: a zero-width interval
    res = {"config": {"target": "t", "backend": "llama.cpp", "dataset": "d", "max_new_tokens": 8, "temperature": 0.0,
                      "k": 2, "draft_policy": "fixed"},
           "environment": {k: "x" for k in ("date", "speculative", "llama_cpp_python", "torch", "transformers", "cpus", "machine")},
           "questions": 4, **agg}
    md = markdown(res)
    head = md.index("## Against the fastest unmodified plain decoding")
    assert head < md.index("## Speedup over our plain decoding")
    assert "end to end **llama-server**" in md and "decoding **transformers**" in md
    assert "| ngram | 1.0 | 0.89x (0.89–0.89) |" in md
    # without an unmodified plain decoder the reference falls back to all plain methods, and says so
    for m in methods:
        m.unmodified = False
    agg2 = aggregate(runner, done)
    assert agg2["fastest_plain"]["end_to_end"] == "llama-cpp-python (our build)" and not agg2["fastest_plain"]["unmodified"]
    assert "no unmodified plain decoder ran" in markdown({**res, **agg2})
    assert not math.isnan(by["llama-server-spec"]["vs_fastest_plain"]["speedup"]["mean"])
