"""``speculative acceptance``: fixed-k chains simulated against the target's greedy output equal what the
engine's fixed policy records; the target as its own draft model accepts everything; resume and bad input."""

from __future__ import annotations

import json

import pytest

from speculative.bench.acceptance import run_lengths, simulate_chain, teacher_forced_lengths, replay_lengths
from speculative.cli import main
from speculative.stats import GenerationStats


@pytest.mark.quick
def test_run_lengths_and_chain_simulation_by_hand():
    assert run_lengths([True, True, False, True, False, True, True, True]).tolist() == [2, 1, 0, 1, 0, 3, 2, 1]
    # 10 tokens: the prefill yields token 0; steps start at 1, 3, 4, 5, 8 (k = 2, budget max_new - i - 1)
    L = [0, 3, 2, 0, 0, 2, 1, 0, 4, 0]
    s = GenerationStats(num_speculative_tokens=2)
    simulate_chain(L, None, 2, 10, s)
    # i=1: m=2, a=2 -> 3 tokens; i=4: a=0 -> 1; i=5: a=2 -> 3; i=8: m=min(2, 10-8-1)=1, a=1 -> 2 tokens
    assert (s.steps, s.new_tokens) == (5, 10)
    assert (s.draft_tokens, s.accepted_tokens) == (2 + 2 + 2 + 1, 2 + 0 + 2 + 1)
    assert s.accept_counts == [1, 1, 2] and s.position_proposed == [4, 3] and s.position_accepted == [3, 2]
    # an n-gram that proposes nothing at a position: a plain step, nothing drafted
    s = GenerationStats(num_speculative_tokens=4)
    simulate_chain([0, 0, 1, 0], [0, 0, 4, 0], 4, 100, s)
    assert (s.steps, s.draft_tokens, s.accepted_tokens, s.new_tokens) == (3, 4, 1, 4)


@pytest.mark.parametrize("spec", ["ngram", "model:smollm2-135m-instruct-draft"])
def test_simulation_equals_the_engines_fixed_policy(smol, spec):
    """Teacher forcing (draft model) and replay (n-gram) reproduce the engine's own counts exactly."""
    from speculative.config import GenerationConfig
    from speculative.drafters import BuildContext, build_drafter
    from speculative.engine import SpeculativeGenerator

    ids = smol.apply_chat_template([{"role": "user", "content": "Write a Python function that squares every "
                                     "number in a list, then explain it in one sentence."}])
    d = build_drafter(spec, smol, BuildContext(backend="llama.cpp", n_ctx=1024))
    try:
        gen = SpeculativeGenerator(smol, d, GenerationConfig(max_new_tokens=28, num_speculative_tokens=3, draft_policy="fixed"))
        r = gen.generate(ids)
        cont = list(r.token_ids)
        if spec == "ngram":
            L, P, _ = replay_lengths(d, ids, cont, 16)
        else:
            L, P = teacher_forced_lengths(d.model, ids, cont), None
        s = GenerationStats(num_speculative_tokens=3)
        simulate_chain(L, P, 3, 28, s)
        e = r.stats
        assert (s.steps, s.new_tokens, s.draft_tokens, s.accepted_tokens) == (e.steps, e.new_tokens, e.draft_tokens, e.accepted_tokens)
        assert s.accept_counts == e.accept_counts and s.position_accepted == e.position_accepted
        assert e.draft_tokens > 0
    finally:
        d.close()


def test_acceptance_command_self_draft_is_exact_and_resumes(tmp_path, capsys):
    out = tmp_path / "a"
    common = ["acceptance", "--dataset", "spec-bench+code", "--categories", "qa", "code", "--per-category", "1,code=2",
              "--max-new-tokens", "12", "--no-progress"]
    assert main(common + ["--k", "2,4", "--drafter", "model:smollm2-135m-instruct", "--drafter", "ngram",
                          "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "acceptance.json").read_text())
    assert res["questions"] == res["questions_measured"] == 3 and res["categories"] == ["qa", "code"]
    rows = {(r["drafter"], r["k"]): r for r in res["rows"]}
    for k in (2, 4):
        me = rows[("model:smollm2-135m-instruct", k)]
        assert me["alpha"] == 1.0 and all(v["alpha"] == 1.0 for v in me["by_category"].values())
        assert me["tau"] > 1.5 and me["accept_counts"][-1] > 0
        assert me["predicted_speedup_flat"] > 0 and me["predicted_speedup_measured"] > 0
        assert 0.0 <= (rows[("ngram", k)]["alpha"] or 0.0) <= 1.0
    assert res["memory"]["peak_rss_mb"] > res["memory"]["target_load_mb"] > 0
    md = (out / "acceptance.md").read_text()
    assert "| model:smollm2-135m-instruct | 2 | 1.00 | 1.00 | 1.00 |" in md and md in printed
    plain_lines = (out / "plain.jsonl").read_text()
    # a rerun with another k and a drafter less reuses everything already measured
    assert main(common + ["--k", "4", "--drafter", "model:smollm2-135m-instruct", "--output", str(out)]) == 0
    assert (out / "plain.jsonl").read_text() == plain_lines
    assert [r["k"] for r in json.loads((out / "acceptance.json").read_text())["rows"]] == [4]
    # a bench folder's plain runs stand in for the plain decoding (--plain-from): the same figures
    bench = tmp_path / "bench"
    bench.mkdir()
    cfg = {"target": "smollm2-135m-instruct", "backend": "llama.cpp", "max_new_tokens": 12, "temperature": 0.0,
           "n_ctx": 4096, "numerics": "exact", "chat": None}
    (bench / "config.json").write_text(json.dumps({"config": cfg}))
    (bench / "runs.jsonl").write_text("".join(json.dumps(
        {"question_id": r["question_id"], "method": "baseline", "turn_token_ids": r["turn_token_ids"],
         "texts": ["(single-turn questions: unused)"], "wall_time_s": 1.0}) + "\n"
        for r in map(json.loads, plain_lines.splitlines())))
    ngram = ["--k", "4", "--drafter", "ngram", "--plain-from", str(bench)]
    assert main(common + ngram + ["--output", str(tmp_path / "a3")]) == 0
    res3 = json.loads((tmp_path / "a3" / "acceptance.json").read_text())
    assert res3["plain"]["from_bench"] == 3
    timed = ("t_draft_ms", "predicted_speedup_flat", "predicted_speedup_measured")  # the n-gram's own timing
    same = {k: v for k, v in rows[("ngram", 4)].items() if k not in timed}
    assert {k: v for k, v in res3["rows"][0].items() if k not in timed} == same
    cfg["max_new_tokens"] = 64
    (bench / "config.json").write_text(json.dumps({"config": cfg}))
    assert main(common + ngram + ["--output", str(tmp_path / "a4")]) == 2
    assert "other max_new_tokens" in capsys.readouterr().err


@pytest.mark.quick
@pytest.mark.parametrize("argv, fragment", [
    (["--drafter", "eagle:smollm2-135m-instruct-eagle"], "chain drafters"),
    (["--drafter", "ngram,tree=3"], "chain drafters"),
    (["--per-category", "1,poetry=2"], "unknown categories"),
])
def test_acceptance_bad_input(argv, fragment, tmp_path, capsys):
    code = main(["acceptance", *argv, "--output", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err
