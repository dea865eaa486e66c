"""Renderings of a :func:`speculative.check.run_check` report: the one-screen text and the JSON file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .check import POWER_TARGET


def write_json(report: dict, path: str | Path) -> None:
    """Write the report atomically (a temporary file renamed into place: never a partial file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def format_report(rep: dict) -> str:
    """The one-screen text report."""
    c, parts = rep["config"], rep["parts"]
    ok = lambda b: "PASS" if b else "FAIL"  # noqa: E731
    inv = "batch-invariant" if rep["batch_invariant"] else f"batch-variant: near-ties < {c['tie_gap']:g} logits tolerated"
    lines = [f"speculative check: target {rep['target']} ({rep['backend']}, {inv}), drafter {rep['drafter']}, "
             f"k={c['k']}, seed {c['seed']}"]
    g = parts["greedy"]
    acc, drafted = (sum(r[key] for r in g["prompts"]) for key in ("accepted_tokens", "draft_tokens"))
    lines.append(f"1. greedy identity, {rep['prompts']} prompts x {c['max_new_tokens']} tokens (draft policy fixed; "
                 f"{acc}/{drafted} draft tokens accepted): {ok(g['passed'])}")
    for r in g["prompts"]:
        if r["verdict"] != "identical":
            d = r["divergence"]
            tk = lambda t: f"{t['id']} {t['text']!r}" if t else "(ended)"  # noqa: E731
            gap = "n/a" if d["top2_gap"] is None else f"{d['top2_gap']:.3g}"
            lines.append(f"   prompt {r['prompt']}: diverges at new token {d['index']}: plain {tk(d['plain'])}, "
                         f"speculative {tk(d['speculative'])}; target top-2 logit gap {gap} -> {r['verdict'].upper()}")
    s = c["sampling"]
    samp = ", ".join([f"temperature {s['temperature']:g}"] + [f"{k.replace('_', '-')} {s[k]:g}" for k, off in
                     (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)) if s[k] != off])
    titles = {"sampling": f"2. verification on real distributions, {c['samples']:,} runs per position",
              "e2e": f"3. end to end, {c['e2e_tokens']}-token continuations, {c['e2e_samples']} seeds per arm"}
    for key, title in titles.items():
        part, tests = parts[key], parts[key]["tests"]
        if part.get("skipped"):
            lines.append(f"{title}: skipped")
            continue
        extra = (f"; {part['draft_tokens_verified']:,} draft tokens verified" if key == "e2e" else
                 f" at {len(tests)} of {part['positions_wanted']} positions wanted")
        lines.append(f"{title} ({samp}): {len(tests)} tests{extra}: {ok(part['passed'])}")
        lines += [f"   {part['reason']}"] if part.get("reason") else []
        live = [t for t in tests if t["cells"] > 1]
        where = lambda t: f"prompt {t['prompt']}, " + (f"new token {t['offset']}" if "offset" in t else t["what"])  # noqa
        if tests:
            worst = min(tests, key=lambda t: t["pvalue"])
            lines.append(f"   smallest p-value {worst['pvalue']:.3g}, Holm-adjusted {worst['adjusted_pvalue']:.3g} ({where(worst)}); "
                         f"{len(tests) - len(live)} tests with a single cell (nothing to test)")
        if live:
            tvs = [t["detectable_tv"] for t in live]
            tv = "> 1" if None in tvs else f"{max(tvs):.3f}"
            lines.append(f"   power against a TV deviation of {c['tv']:g} (at alpha/m = {c['alpha'] / rep['tests']:.2g}): "
                         f"min {min(t['power_at_tv'] for t in live):.3f}; TV caught with probability "
                         f"{POWER_TARGET:g} at every test: {tv}")
        rates = [t["rejection_rate"] for t in tests if t.get("rejection_rate") is not None]
        if rates:
            lines.append(f"   first-draft-token rejection rate: median {float(np.median(rates)):.2f} "
                         f"(min {min(rates):.2f}, max {max(rates):.2f})")
        for t in [t for t in tests if t["rejected"]][:5]:
            bad = f", {t['impossible_tokens']} tokens with p = 0 emitted" if t.get("impossible_tokens") else ""
            lines.append(f"   REJECTED: {where(t)}: p-value {t['pvalue']:.3g}{bad}")
    lines.append(f"family: {rep['tests']} tests, Holm at alpha {c['alpha']:g}: a lossless drafter passes with "
                 f"probability >= {rep['pass_probability_if_lossless']:g}")
    lines.append(f"RESULT: {ok(rep['passed'])}")
    return "\n".join(lines)
