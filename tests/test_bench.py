"""``speculative bench`` and ``speculative profile``: schema, formulas, resume, and the greedy gate."""

from __future__ import annotations

import json

import pytest

from speculative import request as engine_request
from speculative.bench import BenchConfig, BenchRunner
from speculative.bench.datasets import CATEGORIES, load_questions, select
from speculative.bench.report import draft_length_distribution, geometric_mean_ci, predicted_speedup_from_stats
from speculative.cli import main
from speculative.cost_model import CostModel
from speculative.errors import ConfigError
from speculative.stats import GenerationStats
from speculative.verification import VerifyResult

SMOKE = ["--categories", "mt_bench", "qa", "--per-category", "1", "--max-new-tokens", "6", "--no-progress"]


@pytest.mark.quick
def test_datasets_select_evenly_and_devset_is_not_spec_bench():
    qs = load_questions("spec-bench")
    assert len(qs) == 480 and {q.category for q in qs} == set(CATEGORIES[:6])
    mt = select(qs, ["mt_bench"], 8)
    assert len({q.subcategory for q in mt}) == 8  # one per MT-Bench sub-category
    dev = load_questions("dev")
    assert len(dev) >= 30
    spec_texts = {t for q in qs for t in q.turns}
    assert not any(t in spec_texts for q in dev for t in q.turns)
    code = load_questions("code")  # the project's own code prompts: 4 kinds, ids apart from the others
    assert len(code) >= 40 and {q.category for q in code} == {"code"}
    assert {q.subcategory for q in code} == {"write", "edit", "refactor", "explain"}
    assert len({q.subcategory for q in select(code, None, 10)}) == 4
    both = load_questions("spec-bench+code")
    assert len(both) == len(qs) + len(code) and len({q.question_id for q in both}) == len(both)
    assert not any(t in spec_texts for q in code for t in q.turns)


def test_smoke_run_schema_and_markdown(tmp_path, capsys):
    out = tmp_path / "b"
    code = main(["bench", *SMOKE, "--drafter", "ngram", "--drafter", "model:smollm2-135m-instruct,ctx=512",
                 "--peer", "llama-cpp-python", "--peer", "llama-cpp-python-lookup", "--peer", "transformers",
                 "--draft-policy", "fixed", "--output", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    res = json.loads((out / "results.json").read_text())
    assert res["schema_version"] == 1 and res["questions"] == 2 and res["failures"] == []
    assert res["config"]["target"] == "smollm2-135m-instruct" and res["environment"]["llama_cpp_python"]
    labels = [m["method"] for m in res["methods"]]
    assert labels[0] == "baseline" and "ngram" in labels and "llama-cpp-python lookup (our build)" in labels
    for m in res["methods"]:
        for key in ("tokens_per_second", "decode_tokens_per_second", "speedup", "decode_speedup",
                    "speedup_by_category", "greedy_match_fraction", "rss_peak_mb"):
            assert key in m, (m["method"], key)
        assert m["speedup"]["mean"] > 0 and len(m["speedup"]["ci95"]) == 2
        if m["kind"] != "peer":
            for key in ("acceptance_rate", "mean_accepted_tokens", "per_position_acceptance", "time_split"):
                assert key in m
    ours = next(m for m in res["methods"] if m["method"] == "model:smollm2-135m-instruct,ctx=512")
    assert ours["greedy_match_fraction"] == 1.0 and "predicted" in ours and ours["acceptance_rate"] == 1.0
    assert ours["drafter_size_fraction"] == 1.0 and ours["drafter_parameters"] > 90e6  # the target drafting for itself
    # what ran, as the drafter names itself (a head's precision and draft vocabulary; here the kinds)
    by_label = {m["method"]: m for m in res["methods"]}
    assert by_label["ngram"]["drafter"].startswith("ngram") and ours["drafter"] == "model:smollm2-135m-instruct"
    assert "drafter" not in by_label["baseline"] and "drafter" not in by_label["llama-cpp-python lookup (our build)"]
    md = (out / "results.md").read_text()
    assert "| method | MT-Bench | QA | #MAT | overall (95% CI) |" in md
    assert "| ngram |" in md and "## Per method" in md and "## Acceptance by draft position" in md
    assert md in printed
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 * 6
    mt = next(r for r in runs if r["category"] == "mt_bench")
    assert len(mt["turn_token_ids"]) == 2  # both MT-Bench turns
    assert (out / "speedup_by_category.png").stat().st_size > 1000
    assert (out / "acceptance_by_position.png").is_file()


def test_endpoint_peer_timed_from_the_client(tmp_path):
    from conftest import InProcessServer
    from speculative.engine import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram", n_ctx=2048)
    srv = InProcessServer(gen, "smollm2-135m-instruct")
    try:
        out = tmp_path / "e"
        code = main(["bench", *SMOKE, "--peers", "none", "--endpoint", srv.url, "--output", str(out)])
        assert code == 0
        res = json.loads((out / "results.json").read_text())
        ep = next(m for m in res["methods"] if m["method"].startswith("endpoint"))
        assert ep["kind"] == "peer" and ep["new_tokens"] > 0 and ep["greedy_match_fraction"] == 1.0
    finally:
        srv.close()
        gen.close()


def test_sweep_k_plot(tmp_path):
    out = tmp_path / "s"
    code = main(["bench", *SMOKE, "--categories", "qa", "--sweep-k", "1,2", "--draft-policy", "fixed",
                 "--peers", "none", "--output", str(out)])
    assert code == 0
    res = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in res["methods"]] == ["baseline", "ngram k=1", "ngram k=2"]
    assert (out / "speedup_vs_k.png").is_file()


def test_sweep_k_methods_never_draft_from_each_others_answers(tmp_path):
    """One suffix drafter serves every k of a sweep; k = 2 drafting a question after k = 1 answered it must
    draft exactly as it does on a fresh drafter (sharing the tenant, it would find k = 1's whole answer)."""
    cfg = BenchConfig(drafters=["suffix"], categories=["qa"], per_category=1, max_new_tokens=48, sweep_k=[1, 2],
                      draft_policy="fixed")
    r = BenchRunner(cfg, output=tmp_path / "w", progress=False)
    r.load_methods()
    try:
        _, k1, k2 = r.methods
        assert (k1.gen is k2.gen) and {k1.tenant, k2.tenant} == {"bench k=1", "bench k=2"}
        q = r.questions[0]
        fresh = k2.run(q, r.gen_cfg).stats
        k2.gen.drafter.forget()
        first = k1.run(q, r.gen_cfg).stats
        after = k2.run(q, r.gen_cfg).stats
        assert fresh.draft_tokens > 0
        assert (after.draft_tokens, after.accepted_tokens) == (fresh.draft_tokens, fresh.accepted_tokens)
        # control: k = 1 itself does find its own earlier answer
        assert k1.run(q, r.gen_cfg).stats.accepted_tokens > first.accepted_tokens
    finally:
        r.close()


@pytest.mark.quick
def test_sweep_k_refuses_a_suffix_cache_file(tmp_path):
    cfg = BenchConfig(drafters=[f"suffix,cache={tmp_path / 'c.npz'}"], sweep_k=[1, 2], per_category=1)
    with pytest.raises(ConfigError, match="drop cache= or --sweep-k"):
        BenchRunner(cfg, output=tmp_path / "o", progress=False).load_methods()


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    cfg = BenchConfig(drafters=["ngram"], categories=["qa", "translation"], per_category=2, max_new_tokens=4)
    out = tmp_path / "r"
    r1 = BenchRunner(cfg, output=out, progress=False)
    r1.load_methods()
    calls = {"n": 0}
    real_run = r1.methods[1].run

    def flaky(q, c):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_run(q, c)

    r1.methods[1].run = flaky
    with pytest.raises(KeyboardInterrupt):
        r1.run()
    r1.close()
    partial = (out / "runs.jsonl").read_text().splitlines()
    assert 1 <= len(partial) < 8
    # the interrupted run leaves a report of what it measured, marked as such
    assert "of 4 questions measured by every method (interrupted run" in (out / "results.md").read_text()
    assert json.loads((out / "results.json").read_text())["questions_measured"] < 4
    with open(out / "runs.jsonl", "a") as f:
        f.write('{"question_id": 1, "meth')  # a line torn by a kill mid-write
    r2 = BenchRunner(cfg, output=out, progress=False)
    r2.load_methods()
    seen = []
    for m in r2.methods:
        orig = m.run
        m.run = lambda q, c, orig=orig, label=m.label: (seen.append((q.question_id, label)), orig(q, c))[1]
    res = r2.run()
    r2.close()
    assert len(seen) == 8 - len(partial)  # only what was missing ran
    assert res["questions_measured"] == 4 and "Dataset spec-bench, 4 questions," in (out / "results.md").read_text()
    assert res["failures"] == [] and all(m["questions"] == 4 for m in res["methods"])
    with pytest.raises(Exception, match="other settings"):
        BenchRunner(BenchConfig(drafters=["none"], per_category=1), output=out, progress=False)


def test_injected_greedy_mismatch_fails_the_bench(tmp_path, monkeypatch, capsys):
    def wrong(target_choices, draft):
        # accept the first draft token even when the target disagrees
        n = 1 if len(draft) else 0
        return VerifyResult(n, int(target_choices[n]))

    monkeypatch.setattr(engine_request, "verify_greedy", wrong)
    code = main(["bench", *SMOKE, "--categories", "summarization", "--drafter", "ngram", "--draft-policy", "fixed",
                 "--peers", "none", "--output", str(tmp_path / "m"), "--max-new-tokens", "24"])
    captured = capsys.readouterr()
    assert code == 1
    assert "differ from plain greedy decoding" in captured.err
    res = json.loads((tmp_path / "m" / "results.json").read_text())
    assert res["failures"] and res["failures"][0]["method"] == "ngram"


@pytest.mark.quick
def test_predicted_speedup_from_stats_by_hand():
    # 10 steps after prefill: 4 with 3 draft tokens, 6 plain; 12 draft tokens, 6 accepted
    s = GenerationStats(num_speculative_tokens=3)
    s.steps = 11
    s.position_proposed = [4, 4, 4]
    s.position_accepted = [3, 2, 1]
    s.draft_tokens, s.accepted_tokens = 12, 6
    s.new_tokens = 1 + 10 + 6
    s.draft_time_s = 12 * 0.001
    assert draft_length_distribution(s) == {3: 4, 0: 6}
    cm = CostModel([1, 4], [0.010, 0.025])
    p = predicted_speedup_from_stats(s, cm)
    tau = 17 / 11
    e_verify = (4 * 0.025 + 6 * 0.010) / 10
    assert p["tau"] == pytest.approx(tau)
    assert p["speedup"] == pytest.approx(tau * 0.010 / (0.001 * 1.2 + e_verify))


def test_drafter_size_table_and_plot(tmp_path):
    from speculative.bench.report import markdown, plots

    def method(label, k, frac, alpha, tau, speedup, pred):
        return {"method": label, "kind": "ours", "k": k, "questions": 2, "new_tokens": 10, "tokens_per_second": 1.0,
                "decode_tokens_per_second": 1.0, "speedup": {"mean": speedup, "ci95": [speedup, speedup]},
                "decode_speedup": {"mean": speedup, "ci95": [speedup, speedup]}, "speedup_by_category": {},
                "greedy_match_fraction": 1.0, "rss_peak_mb": 1.0, "drafter_parameters": frac * 1e8,
                "drafter_size_fraction": frac, "acceptance_rate": alpha, "mean_accepted_tokens": tau,
                "predicted": {"speedup": pred}, "stats": {}}

    ms = [method(f"model:d{i} k={k}", k, frac, 0.3 + i / 10, 1.2 + i / 5, 0.8, 0.9)
          for i, frac in enumerate((0.01, 0.03, 0.1)) for k in (1, 2)]
    ms += [method("ngram", 4, 0, 0.4, 1.5, 1.1, 1.2), method("ngram,tree=3", 4, 0, 0.3, 1.75, 1.0, 1.1)]
    for m in ms[-2:]:
        del m["drafter_parameters"], m["drafter_size_fraction"]
    res = {"config": {"target": "t", "backend": "llama.cpp", "dataset": "dev", "max_new_tokens": 8,
                      "temperature": 0.0, "k": 2, "draft_policy": "fixed"},
           "environment": {k: "x" for k in ("date", "speculative", "llama_cpp_python", "torch", "transformers", "cpus", "machine")},
           "questions": 2, "methods": ms, "failures": []}
    md = markdown(res)
    assert "## Drafter size" in md and "| model:d2 k=1 | 10.00 M | 10.0% | 50.0% | 1.60 | 0.80x | 0.90x |" in md
    assert "| ngram,tree=3 | 1.75 | 1.50 | +0.25 | 1.00x | 1.10x |" in md
    assert "drafter_size.png" in plots(res, tmp_path) and (tmp_path / "drafter_size.png").stat().st_size > 1000


@pytest.mark.quick
def test_geometric_mean_interval():
    """The interval of every published speedup: a t-interval on the log ratios, checked against scipy's
    own t-interval and against a t quantile from the tables (n = 4: t(0.975, 3) = 3.1824)."""
    import math

    import numpy as np
    from scipy import stats

    ratios = [1.30, 0.95, 1.12, 1.41]
    logs = np.log(ratios)
    se = logs.std(ddof=1) / 2.0
    g, lo, hi = geometric_mean_ci(ratios)
    assert g == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert (lo, hi) == pytest.approx((math.exp(logs.mean() - 3.182446305 * se), math.exp(logs.mean() + 3.182446305 * se)),
                                     rel=1e-9)
    ref = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert (lo, hi) == pytest.approx(tuple(math.exp(x) for x in ref), rel=1e-12)
    # a normal quantile (1.96) or n degrees of freedom instead of n - 1 would give a narrower interval
    assert hi / lo == pytest.approx(math.exp(2 * 3.182446305 * se), rel=1e-9) and hi / lo > math.exp(2 * 2.776 * se)
    for confidence in (0.9, 0.99):
        ref = stats.t.interval(confidence, 9, loc=0.0, scale=1.0)
        g, lo, hi = geometric_mean_ci([math.exp(x) for x in (-1.5, -1, -0.5, 0, 0, 0, 0, 0.5, 1, 1.5)], confidence)
        s = np.std([-1.5, -1, -0.5, 0, 0, 0, 0, 0.5, 1, 1.5], ddof=1) / math.sqrt(10)
        assert (math.log(lo), math.log(hi)) == pytest.approx((ref[0] * s, ref[1] * s), abs=1e-12)
    g, lo, hi = geometric_mean_ci([1.1] * 5)
    assert g == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)


def test_profile_command(capsys):
    """`speculative profile`: T(n) and T(n)/T(1) are the medians its report says they are, recomputed from
    every recorded timing; the weight-read time is the weights over the measured bandwidth; the printed
    ceiling (k+1)·T(1)/T(k+1) is exact for a known table."""
    import statistics

    from speculative.profiling import format_profile

    code = main(["profile", "--max-tokens", "4", "--context", "64", "--repeats", "3", "--rounds", "2", "--json"])
    assert code == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["sizes"] == [1, 2, 3, 4] and len(rep["raw_ms"]) == 2 and all(len(r) == 4 for r in rep["raw_ms"])
    medians = [[statistics.median(ts) for ts in rnd] for rnd in rep["raw_ms"]]
    for i, n in enumerate(rep["sizes"]):
        assert rep["t_ms"][str(n)] == pytest.approx(statistics.median(m[i] for m in medians), rel=1e-12)
        assert rep["ratio_to_t1"][str(n)] == pytest.approx(statistics.median(m[i] / m[0] for m in medians), rel=1e-12)
    assert rep["weight_read_ms"] == pytest.approx(1000 * rep["weight_bytes"] / rep["bandwidth_median_bytes_per_s"])
    assert rep["t1_over_weight_read"] == pytest.approx(rep["t_ms"]["1"] / rep["weight_read_ms"])
    assert 0 < rep["weight_bytes"] < 2**31 and rep["peak_macs"] > 1e9
    known = {"model": "m", "backend": "llama.cpp", "numerics": "exact", "threads": 2, "context_tokens": 64, "cpu": "c",
             "rounds": 1, "repeats": 1, "sizes": [1, 2, 3, 4], "t_ms": {1: 10.0, 2: 15.0, 3: 20.0, 4: 30.0},
             "ratio_to_t1": {1: 1.0, 2: 1.5, 3: 2.0, 4: 3.0}}
    rows = [line.split() for line in format_profile(known).splitlines()[3:7]]
    assert [float(r[1]) for r in rows] == [10.0, 15.0, 20.0, 30.0]
    assert [r[4] for r in rows] == ["1.00x", f"{2 / 1.5:.2f}x", "1.50x", f"{4 / 3:.2f}x"]


@pytest.mark.quick
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["bench", "--per-category", "0"], "per-category"),
        (["bench", "--categories", "poetry", "--peers", "none"], "unknown categories"),
        (["bench", "--peer", "vllm"], "unknown peer"),
        (["bench", "--dataset", "/no/such.jsonl"], "dataset"),
        (["bench", "--k", "0", "--peers", "none"], "num_speculative_tokens"),
    ],
)
def test_bench_bad_input(argv, fragment, capsys, tmp_path):
    with pytest.raises(SystemExit) if fragment == "per-category" else _nullcontext():
        code = main([*argv, "--output", str(tmp_path / "x")])
        assert code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.mark.quick
def test_decode_rates_leave_out_runs_with_too_few_decoded_tokens():
    """A run that stops after a token or two (EOS at once) has no decode rate: it must not enter the decode
    speedup (it made one method's 2.56x with a 95% CI of 0.3-21.5), and the report says it was left out."""
    from types import SimpleNamespace

    from speculative.bench.report import MIN_DECODED_TOKENS, aggregate, markdown

    qs = [SimpleNamespace(question_id=i, category="qa") for i in range(4)]
    methods = [SimpleNamespace(label="baseline", kind="baseline", k=None),
               SimpleNamespace(label="ngram", kind="peer", k=None)]
    runner = SimpleNamespace(cfg=SimpleNamespace(greedy=True, k=4), questions=qs, methods=methods, load_rss_mb={},
                             cost_model=None)

    def row(qid, label, n, wall, prefill):
        return {"question_id": qid, "method": label, "turn_token_ids": [list(range(n))], "texts": ["x"],
                "new_tokens": n, "wall_time_s": wall, "prefill_time_s": prefill, "stats": None, "rss_peak_mb": 1.0}

    done = {}
    for q in range(3):  # 40 tokens: decode 2.0 s for the baseline, 1.0 s for ngram
        done[(q, "baseline")] = row(q, "baseline", 40, 2.5, 0.5)
        done[(q, "ngram")] = row(q, "ngram", 40, 1.5, 0.5)
    # question 3 stops after 2 tokens: the decode times are noise (0.01 s against 0.001 s)
    done[(3, "baseline")] = row(3, "baseline", 2, 0.51, 0.5)
    done[(3, "ngram")] = row(3, "ngram", 2, 0.501, 0.5)
    res = aggregate(runner, done)
    ng = next(m for m in res["methods"] if m["method"] == "ngram")
    assert ng["decode_speedup"]["mean"] == pytest.approx(2.0)  # 10x on question 3 would pull it up
    assert ng["decode_pairs_left_out"] == 1 and ng["decode_runs"] == 3 and ng["decode_runs_left_out"] == 1
    assert ng["decode_tokens_per_second"] == pytest.approx(3 * 39 / 3.0)
    assert ng["speedup"]["mean"] > 1.0 and len(res["methods"]) == 2  # end to end: every question counts
    res.update(config={"target": "t", "backend": "llama.cpp", "dataset": "dev", "max_new_tokens": 40,
                       "temperature": 0.0, "k": 4, "draft_policy": "fixed"},
               environment={k: "x" for k in ("date", "speculative", "llama_cpp_python", "torch", "transformers",
                                             "cpus", "machine")}, questions=4)
    md = markdown(res)
    assert f"at least {MIN_DECODED_TOKENS} tokens" in md and "questions left out: baseline 1 of 4, ngram 1 of 4" in md
    # a wrong filter is caught: with question 3 counted, the decode speedup is no longer 2.0
    import speculative.bench.report as report

    orig = report.MIN_DECODED_TOKENS
    try:
        report.MIN_DECODED_TOKENS = 0
        assert next(m for m in aggregate(runner, done)["methods"]
                    if m["method"] == "ngram")["decode_speedup"]["mean"] > 2.2
    finally:
        report.MIN_DECODED_TOKENS = orig
