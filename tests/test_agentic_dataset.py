"""The ``agentic`` dataset: generated reproducibly, well-formed per category, loadable by the bench."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from speculative.bench.datasets import CATEGORIES, dataset_path, load_questions, select

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "make_agentic.py"
KINDS = ("agent", "code_edit", "extract", "rewrite")
MAX_TURN_CHARS = 2500
MAX_SESSION_CHARS = 6000


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    path = dataset_path("agentic")
    assert path.name == "agentic.jsonl" and path.is_file()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fenced(text: str, lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, f"expected one ```{lang} block"
    return blocks[0]


def test_committed_file_matches_the_generator():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_check_flags_a_stale_file(tmp_path):
    stale = tmp_path / "agentic.jsonl"
    stale.write_text(dataset_path("agentic").read_text(encoding="utf-8") + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(SCRIPT), "--check", "--output", str(stale)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "out of date" in done.stderr


def test_shape_ids_and_lengths(rows):
    assert len(rows) >= 48
    assert all(set(r) == {"question_id", "category", "turns", "session"} for r in rows)
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(KINDS) and min(counts.values()) >= 12
    assert [r["question_id"] for r in rows] == list(range(1, len(rows) + 1))
    assert len({r["session"] for r in rows}) == len(rows)
    assert all(r["session"].startswith(r["category"] + "-") for r in rows)
    assert len({r["turns"][0] for r in rows}) == len(rows), "two sessions share turn 1"
    for r in rows:
        assert 3 <= len(r["turns"]) <= 6, r["session"]
        assert all(isinstance(t, str) and t.strip() for t in r["turns"]), r["session"]
        assert max(map(len, r["turns"])) <= MAX_TURN_CHARS, r["session"]
        assert sum(map(len, r["turns"])) <= MAX_SESSION_CHARS, r["session"]
    # categories interleave (the first rows are one of each), as the bench replays in file order
    assert [r["category"] for r in rows[:4]] == list(KINDS)


def test_no_benchmark_leakage(rows):
    for r in rows:
        for t in r["turns"]:
            assert "HumanEval" not in t and "def has_close_elements" not in t, r["session"]


def test_agent_sessions_carry_a_tool_schema_and_json_results(rows):
    agents = [r for r in rows if r["category"] == "agent"]
    for r in agents:
        tools = json.loads(fenced(r["turns"][0], "json"))
        assert isinstance(tools, list) and tools and all({"name", "arguments"} <= set(t) for t in tools)
        assert '{"final_answer":' in r["turns"][0]
        for t in r["turns"][1:]:
            assert t.startswith("Tool result: "), r["session"]
            json.loads(t.splitlines()[0].removeprefix("Tool result: "))
    # sessions of one domain share the schema (the cross-session repetition this workload is about)
    by_domain = Counter(r["session"].split("-")[1] for r in agents)
    assert sum(n >= 2 for n in by_domain.values()) >= 5


def test_code_edit_sessions_paste_a_compiling_file(rows):
    for r in (r for r in rows if r["category"] == "code_edit"):
        src = fenced(r["turns"][0], "python")
        compile(src, r["session"], "exec")
        assert 30 <= len(src.splitlines()) <= 72, r["session"]
        assert "complete" in r["turns"][0] and all("file" in t for t in r["turns"][1:]), r["session"]


def test_rewrite_sessions_translate_at_most_once(rows):
    for r in (r for r in rows if r["category"] == "rewrite"):
        assert sum(t.startswith("Translate") for t in r["turns"]) <= 1, r["session"]


def test_loads_and_selects_per_category():
    qs = load_questions("agentic")
    assert {q.category for q in qs} == set(KINDS) and set(KINDS) <= set(CATEGORIES)
    for kind in KINDS:
        picked = select(qs, [kind], 5)
        assert len(picked) == 5 and {q.category for q in picked} == {kind}
    assert len(select(qs, None, None)) == len(qs)
    both = load_questions("spec-bench+agentic")  # ids stay apart from Spec-Bench's
    assert len({q.question_id for q in both}) == len(both)
