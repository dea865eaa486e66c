"""Make, or check, the benchmark tables of README.md and docs/benchmarks.md from the committed run files.

Every generated table sits between ``<!-- bench-table NAME -->`` and ``<!-- /bench-table -->``
lines; NAME is one of :data:`TABLES`. The numbers come only from ``docs/bench/RUN/results.json``,
``runs.jsonl`` and ``acceptance.json`` (what ``speculative bench`` and ``speculative acceptance``
wrote), through the bench's own interval formula (:func:`speculative.bench.report.geometric_mean_ci`:
geometric mean of paired per-question ratios, 95% t-interval on the log scale).

    python scripts/bench_tables.py            # rewrite the tables in place
    python scripts/bench_tables.py --check    # exit 1, naming the table, if a doc differs from the files

Interval bounds print with two decimals, or three where two would put a bound on the other side of 1
(0.997 is not "1.00"). Errors: a missing run file or an unknown table name is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")

sys.path.insert(0, str(ROOT / "src"))
from speculative.bench.report import decode_counts, geometric_mean_ci  # noqa: E402

#: the machine each run was measured on (results.json records only "x86_64")
INTEL = "Intel x86-64 with AVX-512, 2 cores"
EPYC = "AMD EPYC (Zen 3), AVX2 only, 2 cores"
ZEN4 = "AMD EPYC (Zen 4), AVX-512 with VNNI, 2 cores"
XEON = "Intel Xeon (Sapphire Rapids class), AVX-512 with VNNI, 2 cores"
MACHINE = {"qwen-gate-v20-zen3": EPYC, "qwen-gate-v19-xeon": XEON, "qwen-gate-v18-zen4": ZEN4, "qwen-gate-v17d-zen4": ZEN4, "qwen-gate-v17c-zen4": ZEN4, "qwen-gate-v17b-zen4": ZEN4, "qwen-gate-v17-zen4": ZEN4, "qwen-gate-v14-zen4": ZEN4, "qwen-gate-v14-xeon": XEON, "qwen-gate-v10-xeon": XEON, "qwen-agentic-clean-env-xeon": XEON, "qwen-gate-clean-env-xeon": XEON, "qwen-gate-clean-env-zen4": ZEN4, "qwen-stock-peer-zen4": ZEN4, "qwen-gate-hugepages-zen4": ZEN4, "qwen-gate-f16attn-zen4": ZEN4, "qwen-gate-kvpad-zen4": ZEN4, "qwen-head-gate-zen4": ZEN4, "qwen-agentic2-zen4": ZEN4, "qwen-gate-zen4": ZEN4, "qwen-eagle-zen4": ZEN4, "qwen-agentic-zen4": ZEN4, "qwen-gate-4": EPYC, "qwen-avx2-tiles": EPYC, "qwen-transformers-flat": EPYC,
           "qwen-xvocab-transformers-3": EPYC}
#: plain decoders that are not ours, by name, for runs that did not record the ``unmodified`` flag: their code
#: and kernels are llama.cpp's (its default build) or PyTorch's, unmodified. The in-process llama-cpp-python peer
#: is not among them: it loads our patched library. (``llama-cpp-python (stock)`` runs record the flag.)
UNMODIFIED_PLAIN = ("llama-server", "transformers")
#: peers that loaded our patched library, under the names older runs gave them
OUR_BUILD = ("llama-cpp-python",)
TARGETS = {"smollm2-135m-instruct": "SmolLM2-135M", "gemma-3-270m": "Gemma-3-270M",
           "qwen2.5-coder-1.5b-instruct": "Qwen2.5-Coder-1.5B"}
CATEGORIES = {"mt_bench": "MT-Bench", "translation": "Transl.", "summarization": "Summ.", "qa": "QA",
              "math_reasoning": "Math", "rag": "RAG", "code": "Code", "agent": "Agent", "code_edit": "Code edit",
              "extract": "Extract", "rewrite": "Rewrite"}


class TableError(Exception):
    """A run file or a table that cannot be made (one line)."""


# ---- reading runs ----------------------------------------------------------------------------------


def results(run: str) -> dict:
    path = BENCH / run / "results.json"
    if not path.is_file():
        raise TableError(f"no run file {path.relative_to(ROOT)}")
    return json.loads(path.read_text())


def runs(run: str) -> dict[tuple[int, str], dict]:
    """(question id, method) -> that run's record."""
    path = BENCH / run / "runs.jsonl"
    if not path.is_file():
        raise TableError(f"no run file {path.relative_to(ROOT)}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["question_id"], r["method"]): r for r in rows}


def method(res: dict, name: str) -> dict:
    for m in res["methods"]:
        if m["method"] == name:
            return m
    raise TableError(f"no method {name!r} in run {res['config']['target']} ({[m['method'] for m in res['methods']]})")


def paired(run: str, name: str, ref: str, decode: bool = False) -> tuple[float, float, float]:
    """End-to-end (or, with ``decode``, prefill-excluded) speedup of method ``name`` over method ``ref``,
    paired per question (mean, low, high). Decode ratios pair only questions that both runs decoded at least
    the report's minimum of tokens for (:func:`speculative.bench.report.decode_counts`), as the report does."""
    done = runs(run)
    qids = sorted({q for q, _ in done})

    def t(r):
        return max(r["wall_time_s"] - r["prefill_time_s"], 1e-9) if decode else r["wall_time_s"]

    pairs = [(done[q, ref], done[q, name]) for q in qids if (q, ref) in done and (q, name) in done]
    if decode:
        pairs = [(a, b) for a, b in pairs if decode_counts(a) and decode_counts(b)]
    ratios = [t(a) / t(b) for a, b in pairs]
    return geometric_mean_ci(ratios)


def fastest_unmodified(run: str) -> str | None:
    """The unmodified plain decoder (a peer) with the highest end-to-end speedup over our plain decoding."""
    return fastest_unmodified_of(results(run))


def is_unmodified(m: dict) -> bool:
    """A peer's recorded ``unmodified`` flag (runs since it was recorded), else its name (older runs)."""
    flag = m.get("unmodified")
    return bool(flag) if flag is not None else m["method"].startswith(UNMODIFIED_PLAIN)


def fastest_unmodified_of(res: dict) -> str | None:
    peers = [m for m in res["methods"] if m.get("plain") and m["kind"] == "peer" and is_unmodified(m)]
    return max(peers, key=lambda m: m["speedup"]["mean"])["method"] if peers else None


def fastest_unmodified_decoding(res: dict) -> str | None:
    """The unmodified plain decoder that decoded fastest (prefill excluded), as the run's report chose it;
    None for runs that did not record it (their decode column then uses the end-to-end fastest)."""
    fp = res.get("fastest_plain") or {}
    return fp.get("decode") if fp.get("unmodified") else None


# ---- formatting --------------------------------------------------------------------------------------


def bound(x: float) -> str:
    s = f"{x:.2f}"
    return f"{x:.3f}" if s == "1.00" and abs(x - 1.0) >= 0.0005 else s


def ratio(mean: float, lo: float | None = None, hi: float | None = None, bold: bool = False) -> str:
    s = f"{mean:.2f}x"
    if lo is not None and hi is not None and lo == lo and hi == hi and (lo, hi) != (1.0, 1.0):
        s += f" ({bound(lo)}–{bound(hi)})"
    return f"**{s}**" if bold else s


def label(name: str, res: dict) -> str:
    """A method's row label: ours, or a peer (an unmodified plain decoder says so); the run's fastest
    plain decoder end to end is marked."""
    out = "our plain decoding" if name == "baseline" else name
    if name in UNMODIFIED_PLAIN:
        out += " (unmodified)"
    elif name.endswith("(stock)"):
        out = out[: -len("(stock)")] + "(stock, unmodified)"
    elif name.split(" ")[0] in OUR_BUILD and "(" not in name:  # older runs' unlabelled in-process peer
        out += " (our build)"
    e2e, dec = fastest_unmodified_of(res), fastest_unmodified_decoding(res)
    if name == e2e:
        out += ", fastest" if dec in (None, e2e) else ", fastest end to end"
    elif name == dec:
        out += ", fastest in decoding"
    return out


# ---- the tables -----------------------------------------------------------------------------------------


def headline(rows: list[tuple[str, str, str]]) -> list[str]:
    """README: per (run, drafter, note), the end-to-end speedup over the fastest unmodified plain decoder."""
    out = ["| target | prompts | drafter | speedup over the fastest unmodified plain decoder (95% CI) | that decoder | "
           "questions | machine | run files |", "|---|---|---|---|---|---|---|---|"]
    for run, name, note in rows:
        res = results(run)
        ref = fastest_unmodified(run)
        if ref is None:
            raise TableError(f"run {run} has no unmodified plain decoder to compare with")
        g, lo, hi = paired(run, name, ref)
        target = TARGETS.get(res["config"]["target"], res["config"]["target"])
        out.append(f"| {target} | {res['config']['dataset']} | {name}{note} | {ratio(g, lo, hi, bold=lo > 1.0)} | {ref} | "
                   f"{res['questions']} | "
                   f"{MACHINE.get(run, INTEL)} | [docs/bench/{run}](docs/bench/{run}/results.md) |")
    return out


def methods_table(run_list: list[str], categories: bool = False) -> list[str]:
    """Every method of each run: against the run's fastest unmodified plain decoder (– where the run had
    none) and against our plain decoding."""
    head = ["run", "method", "e2e vs fastest unmodified plain (95% CI)", "decode vs fastest unmodified plain (95% CI)",
            "e2e vs our plain (95% CI)", "τ", "draft tokens verified (accepted)"]
    cats: list[str] = []
    if categories:
        seen = {c for run in run_list for m in results(run)["methods"] for c in m.get("speedup_by_category", {})}
        cats = [c for c in CATEGORIES if c in seen]
        head += [CATEGORIES[c] for c in cats]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in run_list:
        res = results(run)
        target = TARGETS.get(res["config"]["target"], res["config"]["target"])
        ref = fastest_unmodified_of(res)
        dref = fastest_unmodified_decoding(res) or ref
        for i, m in enumerate(res["methods"]):
            e2e = dec = {}
            if ref is not None:
                g, lo, hi = paired(run, m["method"], ref)
                gd, lod, hid = paired(run, m["method"], dref, decode=True)
                e2e, dec = {"mean": g, "ci95": [lo, hi]}, {"mean": gd, "ci95": [lod, hid]}
            ours = m["speedup"]
            drafted = m.get("stats", {}).get("draft_tokens", 0)
            ours_drafter = m["kind"] == "ours"
            best = ours_drafter and e2e and e2e["ci95"][0] > 1.0
            cells = [
                f"{target}: [{run}](bench/{run}/results.md)" if i == 0 else "",
                label(m["method"], res),
                ratio(e2e["mean"], *e2e["ci95"], bold=best) if e2e else "–",
                ratio(dec["mean"], *dec["ci95"]) if dec else "–",
                ratio(ours["mean"], *ours["ci95"]),
                f"{m['mean_accepted_tokens']:.2f}" if m.get("mean_accepted_tokens") and m["kind"] != "peer" else "–",
                f"{drafted:,} ({m['stats']['accepted_tokens']:,})" if ours_drafter else "–",
            ]
            if categories:
                by = m.get("speedup_by_category", {})
                cells += [f"{by[c]:.2f}x" if c in by and m["method"] != "baseline" else "–" for c in cats]
            out.append("| " + " | ".join(cells) + " |")
    return out


def acceptance_table(run: str) -> list[str]:
    """``speculative acceptance``: τ and α per drafter and k, overall and by category, and the predictions."""
    path = BENCH / run / "acceptance.json"
    if not path.is_file():
        raise TableError(f"no run file {path.relative_to(ROOT)}")
    acc = json.loads(path.read_text())
    cats = [c for c in CATEGORIES if c in acc["categories"]]
    head = ["drafter", "k", "α", "τ"] + [f"τ {CATEGORIES[c]}" for c in cats] + ["predicted, flat T(n)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in acc["rows"]:
        by = r.get("by_category", {})
        taus = [f"{by[c]['tau']:.2f}" if isinstance(by, dict) and c in by else "–" for c in cats]
        out.append("| " + " | ".join([r["drafter"], str(r["k"]), f"{r['alpha']:.2f}", f"{r['tau']:.2f}", *taus,
                                       f"{r['predicted_speedup_flat']:.2f}x"]) + " |")
    return out


TABLES = {
    "headline": lambda: headline([
        ("qwen-gate-v18-zen4", "suffix", ""),
        ("qwen-gate-v18-zen4", "ngram", ""),
        ("qwen-gate-v18-zen4", "suffix+eagle:qwen2.5-coder-1.5b-instruct-eagle,tree=3", " (suffix, then the trained head's token tree)"),
        ("qwen-gate-v18-zen4", "eagle:qwen2.5-coder-1.5b-instruct-eagle", " (trained head; silenced in this run, no draft verified)"),
        ("qwen-gate-v18-zen4", "baseline", " (our plain decoding)"),
        ("qwen-gate-v18-zen4", "model:qwen2.5-coder-0.5b-instruct", " (same-family draft model)"),
        ("qwen-gate-v18-zen4", "llama-server-ngram", " (llama.cpp's own n-gram)"),
        ("qwen-gate-v18-zen4", "llama-cpp-python (stock)", " (pip's default build)"),
        ("qwen-gate-v18-zen4", "llama-server", " (llama.cpp's default build)"),
        ("qwen-gate-v18-zen4", "llama-server-spec", " (llama.cpp's own, 0.5B draft model)"),
        ("qwen-gate-v19-xeon", "suffix", ""),
        ("qwen-gate-v19-xeon", "ngram", ""),
        ("qwen-gate-v19-xeon", "suffix+eagle:qwen2.5-coder-1.5b-instruct-eagle,tree=3", " (suffix, then the trained head's token tree)"),
        ("qwen-gate-v19-xeon", "eagle:qwen2.5-coder-1.5b-instruct-eagle", " (trained head)"),
        ("qwen-gate-v19-xeon", "baseline", " (our plain decoding)"),
        ("qwen-gate-v19-xeon", "model:qwen2.5-coder-0.5b-instruct", " (same-family draft model)"),
        ("qwen-gate-v19-xeon", "llama-server-ngram", " (llama.cpp's own n-gram)"),
        ("qwen-gate-v19-xeon", "llama-cpp-python (stock)", " (pip's default build)"),
        ("qwen-gate-v19-xeon", "llama-server", " (llama.cpp's default build)"),
        ("qwen-gate-v19-xeon", "llama-server-spec", " (llama.cpp's own, 0.5B draft model)"),
        ("qwen-gate-v20-zen3", "suffix", ""),
        ("qwen-gate-v20-zen3", "ngram", ""),
        ("qwen-gate-v20-zen3", "eagle:qwen2.5-coder-1.5b-instruct-eagle", " (trained head)"),
        ("qwen-gate-v20-zen3", "baseline", " (our plain decoding)"),
        ("qwen-gate-v20-zen3", "llama-cpp-python (stock)", " (pip's default build)"),
        ("qwen-gate-v20-zen3", "llama-server", " (llama.cpp's default build)"),
        ("qwen-gate-v20-zen3", "llama-server-spec", " (llama.cpp's own, 0.5B draft model)"),
        ("qwen-agentic-clean-env-xeon", "ngram", " (k = 16)"),
        ("qwen-agentic-clean-env-xeon", "suffix", " (suffix decoding, k = 16)"),
        ("qwen-agentic-clean-env-xeon", "llama-server-ngram-mod", " (llama.cpp's own n-gram)"),
        ("qwen-agentic2-zen4", "suffix", " (suffix decoding, k = 16)"),
        ("qwen-agentic2-zen4", "ngram", " (k = 16)"),
        ("qwen-agentic2-zen4", "llama-server-ngram-mod", " (llama.cpp's own n-gram)"),
        ("qwen-peers-v3", "ngram", ""),
    ]),
    "qwen-gate-v20-zen3": lambda: methods_table(["qwen-gate-v20-zen3"], categories=True),
    "qwen-gate-v19-xeon": lambda: methods_table(["qwen-gate-v19-xeon"], categories=True),
    "qwen-gate-v18-zen4": lambda: methods_table(["qwen-gate-v18-zen4"], categories=True),
    "qwen-gate-v17d-zen4": lambda: methods_table(["qwen-gate-v17d-zen4"], categories=True),
    "qwen-gate-v17c-zen4": lambda: methods_table(["qwen-gate-v17c-zen4"], categories=True),
    "qwen-gate-v17b-zen4": lambda: methods_table(["qwen-gate-v17b-zen4"], categories=True),
    "qwen-gate-v17-zen4": lambda: methods_table(["qwen-gate-v17-zen4"], categories=True),
    "qwen-gate-v14-zen4": lambda: methods_table(["qwen-gate-v14-zen4"], categories=True),
    "qwen-gate-v14-xeon": lambda: methods_table(["qwen-gate-v14-xeon"], categories=True),
    "qwen-gate-v10-xeon": lambda: methods_table(["qwen-gate-v10-xeon"], categories=True),
    "qwen-gate-clean-env-xeon": lambda: methods_table(["qwen-gate-clean-env-xeon"], categories=True),
    "qwen-agentic-clean-env-xeon": lambda: methods_table(["qwen-agentic-clean-env-xeon"], categories=True),
    "qwen-gate-clean-env-zen4": lambda: methods_table(["qwen-gate-clean-env-zen4"], categories=True),
    "qwen-stock-peer-zen4": lambda: methods_table(["qwen-stock-peer-zen4"], categories=True),
    "qwen-gate-hugepages-zen4": lambda: methods_table(["qwen-gate-hugepages-zen4"], categories=True),
    "qwen-gate-f16attn-zen4": lambda: methods_table(["qwen-gate-f16attn-zen4"], categories=True),
    "qwen-gate-kvpad-zen4": lambda: methods_table(["qwen-gate-kvpad-zen4"], categories=True),
    "qwen-head-gate-zen4": lambda: methods_table(["qwen-head-gate-zen4"], categories=True),
    "qwen-agentic2-zen4": lambda: methods_table(["qwen-agentic2-zen4"], categories=True),
    "qwen-gate-zen4": lambda: methods_table(["qwen-gate-zen4"], categories=True),
    "qwen-eagle-zen4": lambda: methods_table(["qwen-eagle-zen4"], categories=True),
    "qwen-agentic-zen4": lambda: methods_table(["qwen-agentic-zen4"], categories=True),
    "small-targets": lambda: methods_table(["smollm2-v4", "gemma-v4"]),
    "qwen-gate-intel": lambda: methods_table(["qwen-gate-3"], categories=True),
    "qwen-peers-intel": lambda: methods_table(["qwen-peers-v3"]),
    "qwen-gate-epyc": lambda: methods_table(["qwen-gate-4"], categories=True),
    "qwen-avx2-tiles": lambda: methods_table(["qwen-avx2-tiles"]),
    "qwen-acceptance": lambda: acceptance_table("qwen-acceptance"),
    "cross-vocab-llama": lambda: methods_table(["gemma-xvocab", "qwen-translation-silent"]),
    "cross-vocab-transformers": lambda: methods_table(["qwen-xvocab-transformers-3", "gemma-xvocab-transformers"]),
    "transformers": lambda: methods_table(["qwen-transformers", "qwen-transformers-flat"]),
}

_BLOCK = re.compile(r"(<!-- bench-table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench-table -->)", re.S)


def render(text: str) -> tuple[str, list[str]]:
    """The document with every table made afresh, and the names of the tables that changed."""
    changed: list[str] = []

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise TableError(f"unknown table {name!r} (known: {', '.join(TABLES)})")
        body = "\n".join(TABLES[name]()) + "\n"
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return _BLOCK.sub(sub, text), changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a table differs from the run files")
    args = ap.parse_args(argv)
    stale = []
    try:
        for doc in DOCS:
            text = doc.read_text()
            new, changed = render(text)
            stale += [f"{doc.relative_to(ROOT)}: {name}" for name in changed]
            if changed and not args.check:
                doc.write_text(new)
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if stale:
        print(("stale: " if args.check else "rewrote: ") + ", ".join(stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
