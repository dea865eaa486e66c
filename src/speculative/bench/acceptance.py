"""``speculative acceptance``: the figures that carry over to other machines, without timing.

For each prompt, the target decodes plainly (greedy) once; every drafter is then
measured against those greedy tokens, and chains of k draft tokens are simulated
with the fixed policy (draft k tokens every step, verify them all), for several k:

- a draft model, teacher-forced: one forward pass over the prompt and the
  continuation gives its greedy prediction at every position. With greedy drafting
  and greedy verification this is exact: draft token j of a step is conditioned on
  the true prefix whenever tokens before it were accepted, and tokens after the
  first rejection are rejected whatever they are (Leviathan et al. 2023, section 2.3,
  at temperature 0);
- n-gram (prompt lookup), replayed: its proposal is asked for at every position of
  the greedy sequence (it depends on the context only).

Per position i this gives L[i], the draft tokens a step starting at i accepts with
unlimited k, and P[i], the tokens the drafter would propose there (fewer when an
n-gram finds no match). A fixed-k chain then accepts min(k, L[i]) per step. The
counts are those of :class:`~speculative.stats.GenerationStats`: acceptance rate
alpha (accepted / drafted), tau (new tokens / target steps, the prefill step
included, as the bench reports it), per-position acceptance and accept counts.

Predicted speedup (decoding only; Leviathan et al. 2023, section 3.4, with the draft
length per step taken from the simulation, as :func:`.report.predicted_speedup_from_stats`):
S = tau T(1) / (t_draft E[m] + E[T(m+1)]), for a flat verification cost (T(n) = T(1),
memory-bound hardware) and for this machine's measured T(n) (:func:`cached_verify_cost`),
with the drafter's measured cost per draft token (a draft model's own T(1); an n-gram's
measured proposal time).

Resumable: the plain greedy runs go to ``plain.jsonl`` and the per-position measures
to ``measures.jsonl`` in the output folder, one line per question; a rerun computes
only what is missing (another drafter or k reuses the plain runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..config import GenerationConfig, SamplingParams
from ..errors import ConfigError
from ..backends.threads import pinned_threads
from ..stats import GenerationStats
from .datasets import CATEGORIES, CATEGORY_TITLES, Question, load_questions, select

DEFAULT_KS = (2, 4, 8)
_CHUNK = 64  # continuation tokens per teacher-forced forward (bounds the logits buffer)


@dataclass
class AcceptanceConfig:
    """What defines an acceptance run. ``per_category_overrides`` maps a category to its own count."""

    target: str = "smollm2-135m-instruct"
    backend: str = "llama.cpp"
    drafters: list[str] = field(default_factory=lambda: ["ngram"])
    dataset: str = "spec-bench"
    categories: list[str] | None = None
    per_category: int | None = 10
    per_category_overrides: dict[str, int] = field(default_factory=dict)
    max_new_tokens: int = 128
    ks: list[int] = field(default_factory=lambda: list(DEFAULT_KS))
    n_ctx: int = 4096
    threads: int | None = None
    numerics: str = "exact"
    chat: bool | None = None
    device: str | None = None
    dtype: str | None = None

    def plain_identity(self) -> dict:
        """The settings the plain greedy runs depend on (drafters and k do not)."""
        d = asdict(self)
        for k in ("drafters", "ks", "threads"):
            d.pop(k)
        return d

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.plain_identity(), sort_keys=True).encode()).hexdigest()[:10]

    def validate(self) -> None:
        if not self.ks or any(k < 1 for k in self.ks):
            raise ConfigError(f"--k values must be >= 1, got {self.ks}")
        if self.max_new_tokens < 2:
            raise ConfigError("--max-new-tokens must be >= 2")
        for c, n in self.per_category_overrides.items():
            if n < 1:
                raise ConfigError(f"--per-category {c}={n}: must be >= 1")


def default_output_dir(cfg: AcceptanceConfig) -> Path:
    name = Path(cfg.target).stem if os.sep in cfg.target else cfg.target
    return Path("bench-results") / f"acceptance-{name}-{cfg.backend}-{cfg.key()}"


def select_questions(cfg: AcceptanceConfig) -> list[Question]:
    """The questions of ``cfg``: ``per_category`` evenly spaced per category, or a category's override."""
    qs = load_questions(cfg.dataset)
    chosen = select(qs, cfg.categories, cfg.per_category)
    present = {q.category for q in qs}
    unknown = [c for c in cfg.per_category_overrides if c not in present]
    if unknown:
        raise ConfigError(f"unknown categories {', '.join(unknown)} in --per-category")
    for c, n in cfg.per_category_overrides.items():
        if cfg.categories and c not in cfg.categories:
            continue
        chosen = [q for q in chosen if q.category != c] + select(qs, [c], n)
    order = {q.question_id: i for i, q in enumerate(qs)}
    return sorted(chosen, key=lambda q: order[q.question_id])


# ---- the per-position measures ---------------------------------------------------------------


def run_lengths(matches: np.ndarray) -> np.ndarray:
    """``out[i]`` = number of consecutive True values starting at i (``matches``: bool [n])."""
    out = np.zeros(len(matches) + 1, dtype=np.int64)
    for i in range(len(matches) - 1, -1, -1):
        out[i] = out[i + 1] + 1 if matches[i] else 0
    return out[:-1]


def teacher_forced_lengths(draft, prompt: list[int], cont: list[int], seq_id: int = 0) -> list[int]:
    """L[i] for a draft model: the greedy draft chain starting at continuation position i matches
    ``cont[i:]`` for L[i] tokens (i = 0..n-1; L[0] is never used, the prefill yields cont[0]).

    One forward over ``prompt + cont[:-1]`` (the continuation in chunks of 64, logits at every
    position); the argmax after token j predicts ``cont[j + 1]``.

    Args:
        draft: the draft model's :class:`~speculative.backends.base.Backend`.
    """
    from ..backends.base import ForwardRequest

    n = len(cont)
    if n < 2:
        return [0] * n
    draft.truncate(seq_id, 0)
    try:
        draft.forward([ForwardRequest(seq_id, list(prompt), logits="none")])
        preds = []
        fed = cont[:-1]
        for s in range(0, len(fed), _CHUNK):
            out = draft.forward([ForwardRequest(seq_id, fed[s : s + _CHUNK], logits="all")])[0].logits
            preds.extend(int(x) for x in np.argmax(out, axis=-1))
    finally:
        draft.truncate(seq_id, 0)
    matches = np.zeros(n, dtype=bool)
    matches[1:] = np.asarray(preds) == np.asarray(cont[1:])
    return run_lengths(matches).tolist()


def replay_lengths(drafter, prompt: list[int], cont: list[int], cap: int) -> tuple[list[int], list[int], float]:
    """L[i] and P[i] for a context-only drafter (n-gram), asked at every continuation position i
    for up to ``cap`` tokens; also the seconds spent proposing."""
    from ..sampling import Sampler

    sampler = Sampler(SamplingParams(temperature=0.0))
    rng = np.random.default_rng(0)
    state = drafter.start(prompt)
    ctx = list(prompt)
    L, P = [0], [0]
    spent = 0.0
    try:
        for i in range(1, len(cont)):
            ctx.append(cont[i - 1])
            t = time.perf_counter()
            prop = drafter.propose(state, ctx, cap, sampler, rng, min_confidence=0.0)
            spent += time.perf_counter() - t
            toks = [int(x) for x in prop.tokens[:cap]] if prop.parents is None else []
            a = 0
            while a < len(toks) and i + a < len(cont) and toks[a] == cont[i + a]:
                a += 1
            L.append(a)
            P.append(len(toks))
    finally:
        drafter.finish(state)
    return L, P, spent


def simulate_chain(L: list[int], P: list[int] | None, k: int, max_new_tokens: int, stats: GenerationStats) -> None:
    """Add one turn's fixed-k chain decoding to ``stats``: steps, new tokens, draft and accepted tokens,
    accept counts and per-position counts, as the engine's fixed policy would record them.

    The prefill step yields ``cont[0]``; each later step at position i drafts
    m = min(k, P[i], max_new_tokens - i - 1) tokens (the engine's budget), accepts
    a = min(m, L[i]) and commits a + 1 tokens (the bonus token), fewer at the end.
    """
    n = len(L)
    if n == 0:
        return
    stats.steps += 1  # the prefill step
    stats.new_tokens += 1
    i = 1
    while i < n:
        m = max(0, min(k, P[i] if P is not None else k, max_new_tokens - i - 1))
        a = min(m, L[i])
        stats.record_step(m, a)
        step = min(a + 1, n - i)
        stats.new_tokens += step
        i += step


# ---- the run ------------------------------------------------------------------------------------


class AcceptanceRun:
    """Loads the target and drafters of an :class:`AcceptanceConfig`, fills the output folder, reports."""

    def __init__(self, cfg: AcceptanceConfig, output: Path | None = None, fresh: bool = False,
                 progress: bool = True, plain_from: Path | None = None):
        cfg.validate()
        self.cfg = cfg
        self.output = Path(output) if output else default_output_dir(cfg)
        self.progress = progress
        self.plain_from = Path(plain_from) if plain_from else None
        self.questions = select_questions(cfg)
        if not self.questions:
            raise ConfigError("no questions selected")
        from ..drafters import parse_drafter_spec

        self.specs = {}
        for s in cfg.drafters:
            d = parse_drafter_spec(s)
            if d.kind not in ("model", "ngram") or d.options.get("tree") not in (None, "0", "1"):
                raise ConfigError(f"acceptance measures chain drafters model:NAME and ngram, not '{s}' "
                                  f"(bench it with --draft-policy fixed)")
            self.specs[s] = d
        self._prepare_output(fresh)
        self.target = None
        self.drafters: dict = {}
        self.memory: dict = {}

    def _prepare_output(self, fresh: bool) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        cfg_path = self.output / "config.json"
        if fresh:
            for name in ("plain.jsonl", "measures.jsonl", "config.json"):
                (self.output / name).unlink(missing_ok=True)
        if cfg_path.exists():
            old = json.loads(cfg_path.read_text())
            # settings added after a run started count at their defaults
            if {**AcceptanceConfig().plain_identity(), **old.get("plain", {})} != self.cfg.plain_identity():
                raise ConfigError(f"{self.output} holds an acceptance run with other settings; pass --fresh "
                                  f"to restart it or --output for a new folder")
        else:
            tmp = cfg_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"plain": self.cfg.plain_identity(), "created": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
            os.replace(tmp, cfg_path)

    @staticmethod
    def _read(path: Path) -> list[dict]:
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue  # a line torn by a kill mid-write
        return rows

    def _append(self, name: str, row: dict) -> None:
        with open(self.output / name, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> None:
        import psutil

        from ..backends import load_backend
        from ..drafters import BuildContext, build_drafter

        c = self.cfg
        proc = psutil.Process()
        rss0 = proc.memory_info().rss
        self.target = load_backend(c.target, c.backend, n_ctx=c.n_ctx, n_threads=pinned_threads(c.threads), numerics=c.numerics,
                                   device=c.device, dtype=c.dtype)
        self.memory["target_load_mb"] = (proc.memory_info().rss - rss0) / 2**20
        chat = (self.target.chat_template is not None) if c.chat is None else c.chat
        if chat and self.target.chat_template is None:
            raise ConfigError(f"{c.target} has no chat template; drop --chat")
        self.chat = chat
        ctx = BuildContext(backend=c.backend, n_threads=pinned_threads(c.threads), numerics=c.numerics, n_ctx=c.n_ctx,
                           device=c.device, dtype=c.dtype)
        for spec in c.drafters:
            rss0 = proc.memory_info().rss
            self.drafters[spec] = build_drafter(self.specs[spec], self.target, ctx)
            self.memory.setdefault("drafter_load_mb", {})[spec] = (proc.memory_info().rss - rss0) / 2**20

    def _imported_plain(self) -> dict[int, dict]:
        """Plain greedy runs of a bench folder with the same target and settings (``--plain-from``)."""
        if self.plain_from is None:
            return {}
        try:
            bcfg = json.loads((self.plain_from / "config.json").read_text())["config"]
        except (OSError, ValueError, KeyError):
            raise ConfigError(f"--plain-from {self.plain_from}: not a bench results folder") from None
        c = self.cfg
        want = {"target": c.target, "backend": c.backend, "max_new_tokens": c.max_new_tokens, "temperature": 0.0,
                "n_ctx": c.n_ctx, "numerics": c.numerics, "chat": c.chat}
        diff = [k for k, v in want.items() if bcfg.get(k) != v]
        if diff:
            raise ConfigError(f"--plain-from {self.plain_from}: its bench ran with other {', '.join(diff)}")
        out = {}
        for r in self._read(self.plain_from / "runs.jsonl"):
            if r.get("method") == "baseline":
                out[r["question_id"]] = r
        return out

    def run(self, report_only: bool = False) -> dict:
        """Measure what is missing (nothing with ``report_only``), then write ``acceptance.json`` / ``.md``
        over the questions measured so far."""
        from tqdm import tqdm

        from ..drafters.base import NoDrafter
        from ..engine import SpeculativeGenerator
        from .methods import EngineMethod, chat_prompt

        c = self.cfg
        plain = {r["question_id"]: r for r in self._read(self.output / "plain.jsonl")}
        imported = self._imported_plain()
        base = SpeculativeGenerator(self.target, NoDrafter(), GenerationConfig(max_new_tokens=c.max_new_tokens))
        method = EngineMethod("baseline", base, "baseline", None, "fixed", self.chat)
        gen_cfg = GenerationConfig(max_new_tokens=c.max_new_tokens, sampling=SamplingParams(0.0)).validate()
        measures = {(r["question_id"], r["drafter"]): r for r in self._read(self.output / "measures.jsonl")}
        cap = max(max(c.ks), 16)
        todo = sum((q.question_id not in plain) + sum((q.question_id, s) not in measures or measures[(q.question_id, s)]["cap"] < max(c.ks)
                                                     for s in c.drafters) for q in self.questions)
        if report_only:
            todo = 0
        bar = tqdm(total=todo, desc="acceptance", unit="run", disable=not self.progress, file=sys.stderr, dynamic_ncols=True)
        try:
            for q in [] if report_only else self.questions:
                if q.question_id not in plain:
                    bar.set_postfix_str(f"q{q.question_id} plain", refresh=False)
                    src = imported.get(q.question_id)
                    if src is not None:
                        turn_ids, texts, wall = src["turn_token_ids"], src["texts"], src["wall_time_s"]
                    else:
                        rec = method.run(q, gen_cfg)
                        turn_ids, texts, wall = rec.turn_token_ids, rec.texts, rec.wall_time_s
                    prompts = [chat_prompt(self.target, q.turns[: i + 1], texts[:i], self.chat) for i in range(len(turn_ids))]
                    row = {"question_id": q.question_id, "category": q.category, "prompts": prompts,
                           "turn_token_ids": turn_ids, "wall_time_s": wall, "from_bench": src is not None}
                    self._append("plain.jsonl", row)
                    plain[q.question_id] = row
                    bar.update(1)
                p = plain[q.question_id]
                for spec in c.drafters:
                    old = measures.get((q.question_id, spec))
                    if old is not None and old["cap"] >= max(c.ks):
                        continue
                    bar.set_postfix_str(f"q{q.question_id} {spec}", refresh=False)
                    row = self._measure(spec, p, cap)
                    row.update(question_id=q.question_id, category=q.category, drafter=spec)
                    self._append("measures.jsonl", row)
                    measures[(q.question_id, spec)] = row
                    bar.update(1)
        finally:
            bar.close()
        self.memory["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        results = self.report(measures)
        for name, text in (("acceptance.json", json.dumps(results, indent=1)), ("acceptance.md", markdown(results))):
            tmp = self.output / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.output / name)
        return results

    def _measure(self, spec: str, plain_row: dict, cap: int) -> dict:
        d = self.drafters[spec]
        turns = []
        spent, proposals = 0.0, 0
        for prompt, cont in zip(plain_row["prompts"], plain_row["turn_token_ids"]):
            if self.specs[spec].kind == "model":
                L = teacher_forced_lengths(d.model, prompt, cont)
                turns.append({"L": L, "P": None})
            else:
                L, P, s = replay_lengths(d, prompt, cont, cap)
                spent += s
                proposals += max(len(cont) - 1, 0)
                turns.append({"L": L, "P": P})
        row = {"cap": cap if self.specs[spec].kind != "model" else 10**9, "turns": turns}
        if proposals:
            row["propose_s"] = spent
            row["proposals"] = proposals
        return row

    # ---- aggregation -------------------------------------------------------------------------

    def report(self, measures: dict) -> dict:
        from ..cost_model import CostModel, cached_verify_cost
        from .report import environment, predicted_speedup_from_stats

        c = self.cfg
        cost = cached_verify_cost(self.target)
        t1 = cost.time(1)
        flat = CostModel(sizes=[1, 2], seconds=[t1, t1])
        cats = [cat for cat in CATEGORIES if any(q.category == cat for q in self.questions)]
        cats += sorted({q.category for q in self.questions} - set(cats))
        rows = []
        for spec in c.drafters:
            ms = [measures[(q.question_id, spec)] for q in self.questions if (q.question_id, spec) in measures]
            t_draft, t_draft_src = self._draft_cost(spec, ms)
            for k in c.ks:
                per_cat = {}
                overall = GenerationStats(num_speculative_tokens=k)
                for cat in cats:
                    s = GenerationStats(num_speculative_tokens=k)
                    for m in ms:
                        if m["category"] == cat:
                            for t in m["turns"]:
                                simulate_chain(t["L"], t["P"], k, c.max_new_tokens, s)
                    overall.merge(s)
                    per_cat[cat] = _summary(s)
                s = overall
                s.draft_time_s = t_draft * s.draft_tokens
                pred_flat = predicted_speedup_from_stats(s, flat).get("speedup")
                pred_here = predicted_speedup_from_stats(s, cost).get("speedup")
                rows.append({
                    "drafter": spec, "k": k, "questions": len(ms), **_summary(s),
                    "t_draft_ms": 1e3 * t_draft, "t_draft_source": t_draft_src,
                    "predicted_speedup_flat": pred_flat, "predicted_speedup_measured": pred_here,
                    "by_category": per_cat,
                })
        plain_rows = self._read(self.output / "plain.jsonl")
        return {
            "config": asdict(c),
            "environment": environment(),
            "questions": len(self.questions),
            "questions_measured": sum(all((q.question_id, s) in measures for s in c.drafters) for q in self.questions),
            "categories": cats,
            "plain": {
                "questions": len(plain_rows),
                "from_bench": sum(1 for r in plain_rows if r.get("from_bench")),
                "new_tokens": sum(len(t) for r in plain_rows for t in r["turn_token_ids"]),
                "wall_time_s": sum(r["wall_time_s"] for r in plain_rows),
            },
            "cost_model": {**cost.to_dict(), "t1_ms": 1e3 * t1},
            "memory": dict(self.memory),
            "rows": rows,
        }

    def _draft_cost(self, spec: str, ms: list[dict]) -> tuple[float, str]:
        """Seconds per draft token: a draft model's own measured T(1); an n-gram's proposal time."""
        from ..cost_model import cached_verify_cost

        d = self.drafters[spec]
        if self.specs[spec].kind == "model":
            return float(cached_verify_cost(d.model).time(1)), "draft model T(1), measured"
        spent = sum(m.get("propose_s", 0.0) for m in ms)
        n = sum(m.get("proposals", 0) for m in ms)
        return (spent / n if n else 0.0), "n-gram proposal time, measured"

    def close(self) -> None:
        for d in self.drafters.values():
            d.close()
        if self.target is not None:
            self.target.close()


def _summary(s: GenerationStats) -> dict:
    return {
        "alpha": s.acceptance_rate if s.draft_tokens else None,
        "tau": s.mean_accepted_tokens if s.steps else None,
        "new_tokens": s.new_tokens,
        "steps": s.steps,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "per_position_acceptance": s.per_position_acceptance,
        "accept_counts": list(s.accept_counts),
    }


def _f(x, nd: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and x != x) else f"{x:.{nd}f}"


def markdown(res: dict) -> str:
    """Tables: tau and alpha per category, then per-position acceptance, accept counts and the
    cost model's predicted speedups per (drafter, k)."""
    c, env, cats = res["config"], res["environment"], res["categories"]
    titles = [CATEGORY_TITLES.get(x, x) for x in cats]
    mem = res["memory"]
    cm = res["cost_model"]
    tn = ", ".join(f"{n}: {1e3 * t:.1f}" for n, t in zip(cm["sizes"], cm["seconds"]) if n in (1, 2, 4, 8, 16))
    lines = [
        f"# Acceptance: {c['target']} ({c['backend']}), fixed-k chains against its greedy output",
        "",
        f"{env['date']}, speculative {env['speculative']}, {env['cpus']} CPUs. Dataset {c['dataset']}, "
        f"{res['questions_measured']} of {res['questions']} questions measured, {res['plain']['new_tokens']} greedy tokens (max {c['max_new_tokens']} per turn). "
        f"T(n) here (ms, n: T): {tn}. Peak RSS of target + drafters: {_f(mem.get('peak_rss_mb'), 0)} MiB "
        f"(target loaded: {_f(mem.get('target_load_mb'), 0)} MiB; "
        + ", ".join(f"{k}: {_f(v, 0)} MiB" for k, v in mem.get("drafter_load_mb", {}).items()) + ").",
        "",
        "## τ (new tokens per target step) by category",
        "",
        "| drafter | k | " + " | ".join(titles) + " | overall |",
        "|---|---|" + "---|" * len(cats) + "---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['drafter']} | {r['k']} | " + " | ".join(_f(r["by_category"][x]["tau"]) for x in cats)
                     + f" | {_f(r['tau'])} |")
    lines += ["", "## α (accepted / drafted tokens) by category", "",
              "| drafter | k | " + " | ".join(titles) + " | overall |",
              "|---|---|" + "---|" * len(cats) + "---|"]
    for r in res["rows"]:
        lines.append(f"| {r['drafter']} | {r['k']} | " + " | ".join(_f(r["by_category"][x]["alpha"]) for x in cats)
                     + f" | {_f(r['alpha'])} |")
    lines += ["", "## Per position, and the speedup the cost model predicts (decoding)", "",
              "| drafter | k | acceptance at draft position 1..k | steps accepting 0..k tokens | draft cost ms/token | "
              "predicted, flat T(n) | predicted, this machine |",
              "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        pos = " / ".join(_f(x) for x in r["per_position_acceptance"])
        lines.append(f"| {r['drafter']} | {r['k']} | {pos or '–'} | {' / '.join(map(str, r['accept_counts'])) or '–'} | "
                     f"{_f(r['t_draft_ms'], 3)} | {_f(r['predicted_speedup_flat'])}x | {_f(r['predicted_speedup_measured'])}x |")
    lines.append("")
    return "\n".join(lines)
