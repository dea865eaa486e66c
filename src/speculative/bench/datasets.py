"""Prompt sets for the bench: Spec-Bench (the test set), the project's code prompts and development set.

``code`` holds 45 programming requests the project wrote (writing functions,
editing and fixing, refactoring, explaining code; never HumanEval or its
derivatives), in one category ``code``. ``agentic`` holds the project's multi-turn sessions
whose answers repeat earlier text (tool-calling agents, whole-file code edits, JSON
extraction, rewrites; ``scripts/make_agentic.py`` writes it) for suffix-style drafters.
Datasets combine with ``+`` (``spec-bench+code``).

Spec-Bench (Xia et al. 2024) groups its 480 questions in six categories; its
first 80 are MT-Bench's eight sub-categories, reported together as
``mt_bench``. Tuning (k, thresholds, priors, drafter training) uses the
development set only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError

MT_BENCH_SUBCATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code",
              "agent", "code_edit", "extract", "rewrite")
CATEGORY_TITLES = {
    "mt_bench": "MT-Bench",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "QA",
    "math_reasoning": "Math",
    "rag": "RAG",
    "code": "Code",
    "agent": "Agent",
    "code_edit": "Code edit",
    "extract": "Extract",
    "rewrite": "Rewrite",
}


@dataclass(frozen=True)
class Question:
    """One benchmark prompt: an id, its Spec-Bench category, and 1+ user turns."""

    question_id: int
    category: str
    turns: tuple[str, ...]
    subcategory: str = ""


def dataset_path(name: str) -> Path:
    """``spec-bench`` (the repository copy), ``code`` (the project's code prompts), ``agentic`` (the project's
    multi-turn sessions), ``dev`` (the development set) or a JSONL path."""
    if name == "spec-bench":
        return Path(str(resources.files("speculative") / "data" / "spec_bench" / "question.jsonl"))
    if name == "dev":
        return Path(str(resources.files("speculative") / "data" / "devset.jsonl"))
    if name == "code":
        return Path(str(resources.files("speculative") / "data" / "code.jsonl"))
    if name == "agentic":
        return Path(str(resources.files("speculative") / "data" / "agentic.jsonl"))
    p = Path(name)
    if not p.is_file():
        raise ConfigError(f"dataset '{name}' is neither 'spec-bench', 'code', 'agentic', 'dev' nor a JSONL file")
    return p


def load_questions(name: str = "spec-bench") -> list[Question]:
    """All questions of a dataset, in file order.

    Raises:
        ConfigError: a missing file or a malformed line (with its line number).
    """
    if "+" in name and not Path(name).is_file():
        return [q for part in name.split("+") for q in load_questions(part)]
    path = dataset_path(name)
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sub = str(row["category"])
            cat = "mt_bench" if sub in MT_BENCH_SUBCATEGORIES or sub == "mt_bench" else sub
            turns = tuple(str(t) for t in row["turns"])
            if not turns:
                raise ValueError("no turns")
            out.append(Question(int(row["question_id"]), cat, turns, str(row.get("subcategory", sub))))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}:{i}: not a question line ({e})") from None
    return out


def select(
    questions: list[Question], categories: list[str] | None = None, per_category: int | None = 10
) -> list[Question]:
    """``per_category`` questions of each category, evenly spaced (so MT-Bench's sub-categories
    are all represented); None takes all. Keeps the dataset's order.

    Raises:
        ConfigError: an unknown category.
    """
    present = sorted({q.category for q in questions}, key=lambda c: (CATEGORIES + (c,)).index(c))
    cats = categories or present
    unknown = [c for c in cats if c not in present]
    if unknown:
        raise ConfigError(f"unknown categories {', '.join(unknown)}: choose from {', '.join(present)}")
    chosen = []
    for c in cats:
        qs = [q for q in questions if q.category == c]
        if per_category is not None and per_category < len(qs):
            step = len(qs) / per_category
            qs = [qs[int(i * step)] for i in range(per_category)]
        chosen.extend(qs)
    order = {q.question_id: i for i, q in enumerate(questions)}
    return sorted(chosen, key=lambda q: order[q.question_id])
