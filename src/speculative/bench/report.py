"""Aggregation and reports of a bench run: ``results.json``, ``results.md`` and PNG plots.

Speedups are geometric means of paired per-question ratios (baseline time /
method time) with a 95% t-interval on the log scale. The predicted speedup
follows Leviathan et al. (2023, section 3.4), generalized to drafts whose
length varies per step: S = tau·T(1) / (t_draft·E[m] + E[T(m+1)]), with the
distribution of the draft length m taken from the per-position counters and
T(n) from the measured verification cost.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path

import numpy as np

from ..cost_model import CostModel, alpha_from_tau
from ..stats import GenerationStats
from .datasets import CATEGORIES, CATEGORY_TITLES

SCHEMA_VERSION = 1

#: decode rates and decode speedups count only runs that decoded at least this many tokens after each
#: turn's first (which prefill yields): a run that stops after a token or two has no decode rate to speak of
MIN_DECODED_TOKENS = 8


def decoded_tokens(row: dict) -> int:
    """Tokens a run generated after the first of each turn (the first comes out of the prefill)."""
    turns = len(row.get("turn_token_ids") or row.get("texts") or [None])
    return int(row["new_tokens"]) - turns


def decode_counts(row: dict) -> bool:
    """Does the run enter decode rates (at least :data:`MIN_DECODED_TOKENS` decoded tokens)?"""
    return decoded_tokens(row) >= MIN_DECODED_TOKENS


def geometric_mean_ci(ratios, confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of paired ratios with a t-interval on the log scale: (mean, low, high)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    n = len(logs)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(np.mean(logs))
    if n < 2:
        return math.exp(m), float("nan"), float("nan")
    from scipy import stats

    se = float(np.std(logs, ddof=1)) / math.sqrt(n)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    return math.exp(m), math.exp(m - t * se), math.exp(m + t * se)


def compare(base: dict, row: dict) -> bool:
    """Does a run's output equal the baseline's (token ids, or text for endpoints)?"""
    if row.get("compare_by") == "text":
        return [t.strip() for t in row["texts"]] == [t.strip() for t in base["texts"]]
    return row["turn_token_ids"] == base["turn_token_ids"]


def draft_length_distribution(s: GenerationStats) -> dict[int, int]:
    """Steps per draft length m (0 = plain step), from the per-position counters (prefill step excluded)."""
    prop = list(s.position_proposed) + [0]
    dist = {m: prop[m - 1] - prop[m] for m in range(1, len(prop)) if prop[m - 1] - prop[m] > 0}
    plain = s.steps - 1 - (prop[0] if prop else 0)
    if plain > 0:
        dist[0] = plain
    return dist


def predicted_speedup_from_stats(s: GenerationStats, cost: CostModel) -> dict:
    """Predicted speedup and its ingredients from merged stats and the cost model."""
    dist = draft_length_distribution(s)
    steps = sum(dist.values())
    if steps == 0 or s.new_tokens == 0:
        return {}
    tau = s.new_tokens / s.steps
    mean_m = sum(m * c for m, c in dist.items()) / steps
    e_verify = sum(c * cost.time(m + 1) for m, c in dist.items()) / steps
    t_draft = s.draft_time_s / s.draft_tokens if s.draft_tokens else 0.0
    speedup = tau * cost.time(1) / (t_draft * mean_m + e_verify)
    draft_steps = sum(c for m, c in dist.items() if m > 0)
    tau_draft = (s.accepted_tokens + draft_steps) / draft_steps if draft_steps else 1.0
    k_eff = max(1, round(s.draft_tokens / draft_steps)) if draft_steps else 1
    return {
        "tau": tau,
        "mean_draft_length": mean_m,
        "alpha": alpha_from_tau(min(tau_draft, k_eff + 1), k_eff),
        "t_draft_s": t_draft,
        "t1_s": cost.time(1),
        "mean_verify_s": e_verify,
        "speedup": speedup,
    }


def _fmt(x: float | None, nd: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def aggregate(runner, done: dict) -> dict:
    """Per-method totals, speedups (overall and per category) and greedy-identity verdicts."""
    cfg = runner.cfg
    qids = [q.question_id for q in runner.questions]
    cat_of = {q.question_id: q.category for q in runner.questions}
    methods = runner.methods
    base_rows = {qid: done.get((qid, "baseline")) for qid in qids}
    out_methods = []
    failures = []
    target_params = _parameters(getattr(getattr(methods[0], "gen", None), "target", None)) if methods else None
    for m in methods:
        rows = [done[(qid, m.label)] for qid in qids if (qid, m.label) in done]
        if not rows:
            continue
        merged = GenerationStats(num_speculative_tokens=m.k or cfg.k)
        any_stats = False
        for r in rows:
            if r.get("stats"):
                merged.merge(GenerationStats.from_dict(r["stats"]))
                any_stats = True
        tot_new = sum(r["new_tokens"] for r in rows)
        tot_wall = sum(r["wall_time_s"] for r in rows)
        tot_prefill = sum(r["prefill_time_s"] for r in rows)
        dec_rows = [r for r in rows if decode_counts(r)]
        dec_tokens = sum(decoded_tokens(r) for r in dec_rows)
        dec_time = sum(r["wall_time_s"] - r["prefill_time_s"] for r in dec_rows)
        e2e, dec, by_cat = [], [], defaultdict(list)
        dec_left_out = 0
        matches = 0
        compared = 0
        for r in rows:
            b = base_rows.get(r["question_id"])
            if b is None:
                continue
            compared += 1
            ok = compare(b, r)
            matches += ok
            if cfg.greedy and m.kind == "ours" and not ok:
                failures.append({"method": m.label, "question_id": r["question_id"]})
            e2e.append(b["wall_time_s"] / r["wall_time_s"])
            if decode_counts(b) and decode_counts(r):
                dec.append((b["wall_time_s"] - b["prefill_time_s"]) / max(r["wall_time_s"] - r["prefill_time_s"], 1e-9))
            else:
                dec_left_out += 1
            by_cat[cat_of[r["question_id"]]].append(e2e[-1])
        g, lo, hi = geometric_mean_ci(e2e)
        gd, lod, hid = geometric_mean_ci(dec)
        entry = {
            "method": m.label,
            "kind": m.kind,
            "k": m.k,
            "questions": len(rows),
            "new_tokens": tot_new,
            "tokens_per_second": tot_new / tot_wall if tot_wall else 0.0,
            # decoded tokens over decode time, runs with too few decoded tokens left out
            "decode_tokens_per_second": dec_tokens / dec_time if dec_time > 0 else float("nan"),
            "decode_runs": len(dec_rows),
            "decode_runs_left_out": len(rows) - len(dec_rows),
            "decode_pairs_left_out": dec_left_out,
            "wall_time_s": tot_wall,
            "prefill_time_s": tot_prefill,
            "speedup": {"mean": g, "ci95": [lo, hi]},
            "decode_speedup": {"mean": gd, "ci95": [lod, hid]},
            "speedup_by_category": {c: geometric_mean_ci(v)[0] for c, v in by_cat.items()},
            "speedup_by_category_ci95": {c: list(geometric_mean_ci(v)[1:]) for c, v in by_cat.items()},
            "greedy_match_fraction": matches / compared if compared else None,
            "rss_peak_mb": max(r.get("rss_peak_mb", 0.0) for r in rows),
            "load_rss_mb": runner.load_rss_mb.get(m.label),
        }
        entry["plain"] = bool(getattr(m, "plain", m.kind == "baseline"))
        entry["unmodified"] = bool(getattr(m, "unmodified", False))
        entry.update(peer_draft_counts(rows))
        gen = getattr(m, "gen", None)
        if m.kind == "ours" and gen is not None:
            entry["drafter"] = gen.drafter.description  # what ran: e.g. a head's precision and draft vocabulary
            n = gen.drafter.non_embedding_parameters()
            if n is not None:
                entry["drafter_parameters"] = n
                if target_params:
                    entry["drafter_size_fraction"] = n / target_params
        if any_stats:
            entry.update(
                acceptance_rate=merged.acceptance_rate,
                mean_accepted_tokens=merged.mean_accepted_tokens,
                mean_accepted_by_category={
                    c: _mat([done[(qid, m.label)] for qid in qids if cat_of[qid] == c and (qid, m.label) in done])
                    for c in by_cat
                },
                per_position_acceptance=merged.per_position_acceptance,
                accept_counts=merged.accept_counts,
                time_split={
                    "prefill_s": merged.prefill_time_s,
                    "draft_s": merged.draft_time_s,
                    "verify_s": merged.verify_time_s,
                    "other_s": max(merged.wall_time_s - merged.prefill_time_s - merged.draft_time_s - merged.verify_time_s, 0.0),
                },
                stats=merged.to_dict(),
                # orchestration: wall time outside the target's and the drafter's forward passes
                overhead={
                    "per_step_ms": 1e3 * merged.overhead_time_s / max(merged.steps, 1),
                    "fraction": merged.overhead_fraction,
                },
            )
            if m.kind == "ours" and runner.cost_model is not None:
                pred = predicted_speedup_from_stats(merged, runner.cost_model)
                if pred:
                    # the prediction covers decoding, so it sits beside the decode-only speedup
                    entry["predicted"] = pred
        out_methods.append(entry)
    fastest = against_fastest_plain(out_methods, done, qids, cat_of)
    return {"methods": out_methods, "failures": failures, **({"fastest_plain": fastest} if fastest else {})}


def peer_draft_counts(rows: list[dict]) -> dict:
    """A speculative peer's own draft counts (llama-server's ``draft_n`` / ``draft_n_accepted``), summed:
    acceptance rate, and tau = tokens per target step = n / (n - accepted) (each step yields its
    accepted draft tokens plus one). Empty for methods that report none."""
    ex = [r["extra"] for r in rows if isinstance(r.get("extra"), dict) and "draft_n" in r["extra"]]
    if not ex:
        return {}
    drafted = sum(int(e["draft_n"]) for e in ex)
    accepted = sum(int(e["draft_n_accepted"]) for e in ex)
    n = sum(r["new_tokens"] for r in rows if isinstance(r.get("extra"), dict) and "draft_n" in r["extra"])
    out = {"draft_tokens": drafted, "accepted_tokens": accepted}
    if drafted:
        out["acceptance_rate"] = accepted / drafted
    if n > accepted:
        out["mean_accepted_tokens"] = n / (n - accepted)
    return out


def against_fastest_plain(entries: list[dict], done: dict, qids: list[int], cat_of: dict) -> dict | None:
    """Every method against the FASTEST UNMODIFIED plain decoding of the target measured in the run
    (llama-server from llama.cpp's default build, the stock llama-cpp-python, transformers: whichever is
    fastest; a method counts as unmodified by its recorded ``unmodified`` flag), the headline ratio.
    Our own plain decoding and peers that load our patched library are never the reference; a run with
    no unmodified plain decoder falls back to the fastest plain method of all and says so
    (``unmodified: false`` in the returned references).

    The reference is the plain method with the highest paired geometric-mean speedup over our
    baseline, end to end and (separately) in decoding; each method's ratio is then paired per
    question against the reference's time (geometric mean, 95% t-interval on the log scale).
    Adds ``vs_fastest_plain`` to each entry; returns the references, or None without plain methods.
    """
    plain = [e for e in entries if e.get("plain") and e["speedup"]["mean"] == e["speedup"]["mean"]]
    if not plain:
        return None
    unmodified = [e for e in plain if e.get("unmodified")]
    plain = unmodified or plain
    ref_e2e = max(plain, key=lambda e: e["speedup"]["mean"])
    plain_dec = [e for e in plain if e["decode_speedup"]["mean"] == e["decode_speedup"]["mean"]] or plain
    ref_dec = max(plain_dec, key=lambda e: e["decode_speedup"]["mean"])

    def wall(r):
        return r["wall_time_s"]

    def decode(r):
        return max(r["wall_time_s"] - r["prefill_time_s"], 1e-9)

    for e in entries:
        e2e, dec, by_cat = [], [], defaultdict(list)
        for qid in qids:
            r, a, b = done.get((qid, e["method"])), done.get((qid, ref_e2e["method"])), done.get((qid, ref_dec["method"]))
            if r is None:
                continue
            if a is not None:
                e2e.append(wall(a) / wall(r))
                by_cat[cat_of[qid]].append(e2e[-1])
            if b is not None and decode_counts(b) and decode_counts(r):
                dec.append(decode(b) / decode(r))
        g, lo, hi = geometric_mean_ci(e2e)
        gd, lod, hid = geometric_mean_ci(dec)
        e["vs_fastest_plain"] = {
            "speedup": {"mean": g, "ci95": [lo, hi]},
            "decode_speedup": {"mean": gd, "ci95": [lod, hid]},
            "speedup_by_category": {c: geometric_mean_ci(v)[0] for c, v in by_cat.items()},
        }
    return {
        "end_to_end": ref_e2e["method"],
        "end_to_end_tokens_per_second": ref_e2e["tokens_per_second"],
        "decode": ref_dec["method"],
        "decode_tokens_per_second": ref_dec["decode_tokens_per_second"],
        "plain_methods": [e["method"] for e in plain],
        "unmodified": bool(unmodified),
    }


def _chain_of(label: str) -> str:
    """The chain drafter a tree method compares with: its label without the ``tree=N`` option."""
    head, _, k = label.partition(" k=")
    opts = [o for o in head.split(",") if not o.startswith("tree=")]
    return ",".join(opts) + (f" k={k}" if k else "")


def _parameters(backend) -> int | None:
    """Non-embedding parameters of a backend's model (None where it cannot tell)."""
    try:
        return backend.non_embedding_parameters() if backend is not None else None
    except (NotImplementedError, AttributeError, OSError):
        return None


def _mat(rows) -> float:
    s = GenerationStats()
    for r in rows:
        if r.get("stats"):
            s.merge(GenerationStats.from_dict(r["stats"]))
    return s.mean_accepted_tokens


def environment() -> dict:
    def v(p):
        try:
            return metadata.version(p)
        except metadata.PackageNotFoundError:
            return None

    from .. import __version__

    return {
        "date": time.strftime("%Y-%m-%d"),
        "speculative": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "llama_cpp_python": v("llama-cpp-python"),
        "torch": v("torch"),
        "transformers": v("transformers"),
    }


def _overhead(o: dict | None) -> str:
    """Orchestration overhead per step: milliseconds and share of the wall time."""
    if not o:
        return "–"
    return f"{_fmt(o['per_step_ms'], 2)} ms ({_fmt(o['fraction'] * 100, 1)}%)"


def _headline(results: dict) -> list[str]:
    """The headline table: every method against the fastest plain decoding measured in the run."""
    ref = results.get("fastest_plain")
    if not ref:
        return []
    lines = [
        "## Against the fastest unmodified plain decoding of the target in this run"
        if ref.get("unmodified") else
        "## Against the fastest plain decoding of the target in this run (no unmodified plain decoder ran: "
        "add --peer llama-server)",
        "",
        f"Fastest plain decoding: end to end **{ref['end_to_end']}** ({_fmt(ref['end_to_end_tokens_per_second'], 1)} tok/s), "
        f"decoding **{ref['decode']}** ({_fmt(ref['decode_tokens_per_second'], 1)} tok/s); "
        f"plain decoders measured: {', '.join(ref['plain_methods'])}.",
        "",
        "| method | tok/s e2e | speedup e2e (95% CI) | tok/s decode | decode speedup (95% CI) | acceptance | τ | greedy match |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in results["methods"]:
        v = m.get("vs_fastest_plain")
        if not v:
            continue
        s, d = v["speedup"], v["decode_speedup"]
        gm = m.get("greedy_match_fraction")
        acc = m.get("acceptance_rate")
        lines.append(
            f"| {m['method']} | {_fmt(m['tokens_per_second'], 1)} | "
            f"{_fmt(s['mean'])}x ({_fmt(s['ci95'][0])}–{_fmt(s['ci95'][1])}) | "
            f"{_fmt(m['decode_tokens_per_second'], 1)} | {_fmt(d['mean'])}x ({_fmt(d['ci95'][0])}–{_fmt(d['ci95'][1])}) | "
            f"{_fmt(acc * 100, 1) + '%' if acc is not None else '–'} | {_fmt(m.get('mean_accepted_tokens', float('nan')))} | "
            f"{_fmt(gm * 100, 0) + '%' if gm is not None else '–'} |"
        )
    return lines + [""]


def _decode_note(methods: list[dict]) -> str:
    """Which runs the decode columns leave out (too few decoded tokens for a rate)."""
    out = [f"{m['method']} {m['decode_pairs_left_out']} of {m['questions']}" for m in methods
           if m.get("decode_pairs_left_out")]
    note = (f"Decode rates and decode speedups count only runs that decoded at least {MIN_DECODED_TOKENS} tokens "
            "after each turn's first (a question enters a decode speedup when both runs did); ")
    return note + ("questions left out: " + ", ".join(out) + "." if out else "none was left out.")


def markdown(results: dict) -> str:
    cfg = results["config"]
    env = results["environment"]
    cats = [c for c in CATEGORIES if any(c in m.get("speedup_by_category", {}) for m in results["methods"])]
    lines = [
        f"# Bench: {cfg['target']} on {cfg['backend']}",
        "",
        f"{env['date']}, speculative {env['speculative']}, llama-cpp-python {env['llama_cpp_python']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, {env['cpus']} CPUs ({env['machine']}).",
        f"Dataset {cfg['dataset']}, {_question_count(results)}, max {cfg['max_new_tokens']} new tokens, "
        f"temperature {cfg['temperature']}, "
        + (f"k swept over {', '.join(map(str, cfg['sweep_k']))}" if cfg.get("sweep_k") else f"k = {cfg['k']}")
        + f", draft policy {cfg['draft_policy']}.",
        "",
        *_headline(results),
        "## Speedup over our plain decoding (the baseline; end-to-end, prefill included), Spec-Bench form",
        "",
        "| method | " + " | ".join(CATEGORY_TITLES.get(c, c) for c in cats) + " | #MAT | overall (95% CI) |",
        "|---|" + "---|" * len(cats) + "---|---|",
    ]
    for m in results["methods"]:
        if m["kind"] == "baseline":
            continue
        sp = m["speedup"]
        row = [m["method"]] + [_fmt(m["speedup_by_category"].get(c, float("nan"))) + "x" for c in cats]
        row.append(_fmt(m.get("mean_accepted_tokens", float("nan"))))
        row.append(f"{_fmt(sp['mean'])}x ({_fmt(sp['ci95'][0])}–{_fmt(sp['ci95'][1])})")
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "## Per method",
        "",
        "| method | tok/s e2e | tok/s decode | decode speedup (95% CI) | predicted | acceptance | τ | prefill / draft / verify / other (s) | overhead per step | greedy match | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results["methods"]:
        d = m["decode_speedup"]
        pred = m.get("predicted", {}).get("speedup")
        ts = m.get("time_split")
        split = " / ".join(_fmt(ts[k], 1) for k in ("prefill_s", "draft_s", "verify_s", "other_s")) if ts else "–"
        gm = m.get("greedy_match_fraction")
        lines.append(
            f"| {m['method']} | {_fmt(m['tokens_per_second'], 1)} | {_fmt(m['decode_tokens_per_second'], 1)} | "
            f"{_fmt(d['mean'])}x ({_fmt(d['ci95'][0])}–{_fmt(d['ci95'][1])}) | "
            f"{_fmt(pred) + 'x' if pred else '–'} | "
            f"{_fmt(m['acceptance_rate'] * 100, 1) + '%' if 'acceptance_rate' in m else '–'} | "
            f"{_fmt(m.get('mean_accepted_tokens', float('nan')))} | {split} | "
            f"{_overhead(m.get('overhead'))} | "
            f"{_fmt(gm * 100, 0) + '%' if gm is not None else '–'} | {_fmt(m['rss_peak_mb'], 0)} |"
        )
    lines += ["", _decode_note(results["methods"])]
    pos = [m for m in results["methods"] if m.get("per_position_acceptance") and m["kind"] == "ours"]
    if pos:
        width = max(len(m["per_position_acceptance"]) for m in pos)
        lines += ["", "## Acceptance by draft position", "",
                  "| method | " + " | ".join(str(i + 1) for i in range(width)) + " |",
                  "|---|" + "---|" * width]
        for m in pos:
            a = m["per_position_acceptance"] + [None] * (width - len(m["per_position_acceptance"]))
            lines.append(f"| {m['method']} | " + " | ".join(_fmt(x) for x in a) + " |")
    chains = {m["method"]: m for m in results["methods"] if m["kind"] == "ours"}
    trees = [(m, chains.get(_chain_of(m["method"]))) for m in chains.values() if _chain_of(m["method"]) != m["method"]]
    trees = [(t, c) for t, c in trees if c is not None and "mean_accepted_tokens" in t and "mean_accepted_tokens" in c]
    if trees:
        lines += ["", "## Token trees against their chain drafter", "",
                  "| tree method | τ tree | τ chain | gain in τ | decode speedup tree | decode speedup chain |",
                  "|---|---|---|---|---|---|"]
        for t, c in trees:
            lines.append(f"| {t['method']} | {_fmt(t['mean_accepted_tokens'])} | {_fmt(c['mean_accepted_tokens'])} | "
                         f"{t['mean_accepted_tokens'] - c['mean_accepted_tokens']:+.2f} | "
                         f"{_fmt(t['decode_speedup']['mean'])}x | {_fmt(c['decode_speedup']['mean'])}x |")
    sized = [m for m in results["methods"] if m.get("drafter_parameters")]
    if sized:
        lines += ["", "## Drafter size", "",
                  "| method | non-embedding parameters | % of target | acceptance | τ | decode speedup | predicted |",
                  "|---|---|---|---|---|---|---|"]
        for m in sized:
            frac = m.get("drafter_size_fraction")
            pred = m.get("predicted", {}).get("speedup")
            acc = m.get("acceptance_rate")
            lines.append(f"| {m['method']} | {m['drafter_parameters'] / 1e6:.2f} M | "
                         f"{_fmt(frac * 100, 1) + '%' if frac else '–'} | "
                         f"{_fmt(acc * 100, 1) + '%' if acc is not None else '–'} | "
                         f"{_fmt(m.get('mean_accepted_tokens', float('nan')))} | {_fmt(m['decode_speedup']['mean'])}x | "
                         f"{_fmt(pred) + 'x' if pred else '–'} |")
    if results["failures"]:
        lines += ["", "## FAILURES: outputs that differ from plain greedy decoding", ""]
        lines += [f"- {f['method']} on question {f['question_id']}" for f in results["failures"]]
    lines.append("")
    return "\n".join(lines)


def plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    ms = [m for m in results["methods"] if m["kind"] != "baseline"]
    cats = [c for c in CATEGORIES if any(c in m["speedup_by_category"] for m in ms)]
    if ms and cats:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(ms)
        x = np.arange(len(cats))
        for i, m in enumerate(ms):
            vals = [m["speedup_by_category"].get(c, np.nan) for c in cats]
            cis = [m.get("speedup_by_category_ci95", {}).get(c, [np.nan, np.nan]) for c in cats]
            err = np.array([[v - (lo if lo == lo else v), (hi if hi == hi else v) - v] for v, (lo, hi) in zip(vals, cis)]).T
            ax.bar(x + i * w, vals, w, label=m["method"], yerr=err, capsize=2)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x + w * (len(ms) - 1) / 2, [CATEGORY_TITLES.get(c, c) for c in cats])
        ax.set_ylabel("speedup over plain decoding")
        ax.set_title(f"{results['config']['target']} ({results['config']['backend']})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "speedup_by_category.png", dpi=120)
        plt.close(fig)
        written.append("speedup_by_category.png")
    pos = [m for m in ms if m.get("per_position_acceptance")]
    if pos:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in pos:
            a = [np.nan if v is None else v for v in m["per_position_acceptance"]]
            ax.plot(range(1, len(a) + 1), a, marker="o", label=m["method"])
        ax.set_xlabel("draft position")
        ax.set_ylabel("fraction of steps accepting it")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "acceptance_by_position.png", dpi=120)
        plt.close(fig)
        written.append("acceptance_by_position.png")
    swept = defaultdict(list)
    for m in ms:
        if m["kind"] == "ours" and " k=" in m["method"]:
            swept[m["method"].rsplit(" k=", 1)[0]].append(m)
    if swept:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (name, group) in enumerate(swept.items()):
            group.sort(key=lambda m: m["k"])
            ks = [m["k"] for m in group]
            color = f"C{i % 10}"  # measured (solid) and predicted (dashed) share the method's color
            ax.plot(ks, [m["decode_speedup"]["mean"] for m in group], marker="o", color=color, label=f"{name} measured")
            ax.plot(ks, [m.get("predicted", {}).get("speedup", np.nan) for m in group], ls="--", marker="x",
                    color=color, label=f"{name} predicted")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel("k (most draft tokens per step)")
        ax.set_ylabel("decode speedup")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "speedup_vs_k.png", dpi=120)
        plt.close(fig)
        written.append("speedup_vs_k.png")
    sized = [m for m in ms if m["kind"] == "ours" and m.get("drafter_size_fraction") and "acceptance_rate" in m]
    if len({m["drafter_size_fraction"] for m in sized}) >= 2:
        written.append(_drafter_size_plot(sized, out, plt))
    return written


def _drafter_size_plot(sized: list[dict], out: Path, plt) -> str:
    """Acceptance rate, mean accepted tokens and decode speedup (measured, and the cost model's
    prediction) against drafter size, one line per k: the three knobs practitioners tune."""
    by_k = defaultdict(list)
    for m in sized:
        by_k[m["k"]].append(m)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for i, (k, group) in enumerate(sorted(by_k.items(), key=lambda kv: kv[0] or 0)):
        group.sort(key=lambda m: m["drafter_size_fraction"])
        x = [100 * m["drafter_size_fraction"] for m in group]
        c = f"C{i % 10}"  # one color per k; measured solid, predicted dashed
        axes[0].plot(x, [m["acceptance_rate"] for m in group], marker="o", color=c, label=f"k={k}")
        axes[1].plot(x, [m["mean_accepted_tokens"] for m in group], marker="o", color=c, label=f"k={k}")
        axes[2].plot(x, [m["decode_speedup"]["mean"] for m in group], marker="o", color=c, label=f"k={k} measured")
        axes[2].plot(x, [m.get("predicted", {}).get("speedup", np.nan) for m in group], ls="--", marker="x",
                     color=c, label=f"k={k} predicted")
    for ax, ylabel in zip(axes, ("acceptance rate α", "mean accepted tokens per step τ", "decode speedup")):
        ax.set_xlabel("drafter size (% of target's non-embedding parameters)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    axes[2].axhline(1.0, color="k", lw=0.8)
    fig.tight_layout()
    fig.savefig(out / "drafter_size.png", dpi=120)
    plt.close(fig)
    return "drafter_size.png"


def _question_count(results: dict) -> str:
    n, measured = results["questions"], results.get("questions_measured", results["questions"])
    if measured == n:
        return f"{n} questions"
    return f"{measured} of {n} questions measured by every method (interrupted run: rerun the command to resume)"


def write_reports(runner, done: dict) -> dict:
    """Aggregate ``done`` and write results.json, results.md and the plots; a partial ``done``
    (an interrupted run) gives a report of the questions measured so far."""
    from dataclasses import asdict

    agg = aggregate(runner, done)
    labels = [m.label for m in runner.methods]
    measured = sum(all((q.question_id, lab) in done for lab in labels) for q in runner.questions)
    results = {
        "schema_version": SCHEMA_VERSION,
        "config": asdict(runner.cfg),
        "environment": environment(),
        "questions": len(runner.questions),
        "questions_measured": measured,
        "cost_model": runner.cost_model.to_dict() if runner.cost_model is not None else None,
        **agg,
    }
    out = runner.output
    for name, text in (("results.json", json.dumps(results, indent=1)), ("results.md", markdown(results))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)
    results["plots"] = plots(results, out)
    return results
