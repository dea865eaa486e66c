"""Constrained generation (JSON Schema extraction) with and without speculation.

``python -m speculative.bench.constrained [--drafter SPEC ...] [--k K] [--max-new-tokens N]``

Each of the project's JSON extraction prompts (``speculative/data/json_extraction.jsonl``:
a short passage and the schema of the fields to extract) runs under its schema with
plain constrained decoding (drafter ``none``) and with each drafter, in a rotated order
per prompt (interleaved, so machine drift hits all methods alike), greedy, every run
from empty KV caches. Reported per method: decode tokens/s (new tokens after the first
over the time after prefill, summed over prompts), the speedup over plain constrained
decoding (geometric mean over prompts of paired decode-time ratios, 95% t-interval),
mean accepted tokens per step (tau), draft tokens cut by the constraint, how many outputs
are valid under their schema, and how many equal plain decoding's token for token (they
all must: the run fails, exit 1, otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path

from ..errors import SpeculativeError


def load_prompts(path: str | None = None) -> list[dict]:
    """The extraction prompts: dicts with ``id``, ``prompt`` and ``schema``."""
    p = Path(path) if path else Path(str(resources.files("speculative") / "data" / "json_extraction.jsonl"))
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    for r in rows:
        if not {"id", "prompt", "schema"} <= set(r):
            raise SpeculativeError(f"{p}: every line needs id, prompt and schema")
    return rows


def valid_under(text: str, schema: dict) -> bool:
    """True when ``text`` is JSON valid under ``schema`` (jsonschema when installed, else parse + required keys)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema comes with the test extras' dependencies
        return isinstance(obj, dict) and all(k in obj for k in schema.get("required", []))
    try:
        jsonschema.validate(obj, schema)
    except jsonschema.ValidationError:
        return False
    return True


def run(target: str, drafters: list[str], k: int, max_new_tokens: int, draft_policy: str, limit: int | None,
        threads: int | None, prompts_path: str | None = None, progress: bool = True) -> dict:
    from ..backends import load_backend
    from ..drafters import BuildContext, build_drafter, tree_leaves
    from ..engine import SpeculativeGenerator

    rows = load_prompts(prompts_path)[:limit]
    backend = load_backend(target, n_ctx=4096, n_threads=threads, tree_width=max(tree_leaves(d) for d in drafters))
    gens = {"none": SpeculativeGenerator(backend)}
    try:
        for spec in drafters:
            gens[spec] = SpeculativeGenerator(backend, build_drafter(spec, backend, BuildContext(n_threads=threads)))
        methods = list(gens)
        runs = []
        for qi, row in enumerate(rows):
            order = methods[qi % len(methods):] + methods[: qi % len(methods)]
            by_method = {}
            for name in order:
                gen = gens[name]
                gen.reset_caches()
                t0 = time.perf_counter()
                req = gen.new_request(row["prompt"], json_schema=row["schema"], max_new_tokens=max_new_tokens,
                                      num_speculative_tokens=k, draft_policy=draft_policy)
                g = gen._steps(req)
                for _ in g:
                    pass
                res = req.result()
                s = res.stats
                by_method[name] = {
                    "prompt": row["id"], "method": name, "new_tokens": len(res.token_ids),
                    "wall_s": time.perf_counter() - t0, "decode_s": s.decode_time_s, "steps": s.steps,
                    "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
                    "cut_tokens": req.constraint_cut_tokens, "finish_reason": res.finish_reason,
                    "valid": valid_under(res.text, row["schema"]), "token_ids": res.token_ids,
                }
                if progress:
                    r = by_method[name]
                    print(f"[{qi + 1}/{len(rows)}] {row['id']:<12} {name:<40} {r['new_tokens']:>4} tokens "
                          f"{r['decode_s']:.2f} s valid={r['valid']}", file=sys.stderr, flush=True)
            for name, r in by_method.items():
                r["identical"] = r["token_ids"] == by_method["none"]["token_ids"]
                runs.append(r)
    finally:
        for name, gen in gens.items():
            if name != "none":
                gen.drafter.close()
        backend.close()
    return summarize(runs, methods, target=target, k=k, max_new_tokens=max_new_tokens, draft_policy=draft_policy)


def summarize(runs: list[dict], methods: list[str], **config) -> dict:
    out = {"config": config, "methods": [], "runs": runs}
    base = None
    for name in methods:
        rs = [r for r in runs if r["method"] == name]
        dec_tokens = sum(max(r["new_tokens"] - 1, 0) for r in rs)
        dec_s = sum(r["decode_s"] for r in rs)
        steps = sum(max(r["steps"] - 1, 0) for r in rs)  # the first step is the prefill's token
        m = {
            "method": name, "prompts": len(rs), "new_tokens": sum(r["new_tokens"] for r in rs),
            "decode_tokens_per_s": dec_tokens / dec_s if dec_s > 0 else 0.0,
            "tau": dec_tokens / steps if steps else 0.0,
            "draft_tokens": sum(r["draft_tokens"] for r in rs),
            "accepted_tokens": sum(r["accepted_tokens"] for r in rs),
            "cut_tokens": sum(r["cut_tokens"] for r in rs), "valid": sum(r["valid"] for r in rs),
            "identical": sum(r["identical"] for r in rs),
        }
        if base is None:
            base = m["decode_tokens_per_s"]
        m["speedup"] = m["decode_tokens_per_s"] / base if base else 0.0
        m["speedup_geomean"], m["speedup_ci95"] = _paired_speedup(runs, name)
        out["methods"].append(m)
    return out


def _paired_speedup(runs: list[dict], method: str) -> tuple[float, tuple[float, float]]:
    """Geometric mean over prompts of plain decode time / method decode time (the outputs are the same
    tokens), with a 95% t-interval on the log ratios."""
    import math

    from scipy import stats

    plain = {r["prompt"]: r["decode_s"] for r in runs if r["method"] == "none"}
    logs = [math.log(plain[r["prompt"]] / r["decode_s"]) for r in runs
            if r["method"] == method and r["decode_s"] > 0 and plain.get(r["prompt"], 0) > 0]
    if not logs:
        return 0.0, (0.0, 0.0)
    mean = sum(logs) / len(logs)
    if len(logs) < 2:
        return math.exp(mean), (math.exp(mean), math.exp(mean))
    sem = stats.sem(logs)
    half = stats.t.ppf(0.975, len(logs) - 1) * sem if sem > 0 else 0.0
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def markdown(summary: dict) -> str:
    c = summary["config"]
    lines = [
        f"Constrained (JSON Schema) greedy decoding, {c['target']}, k = {c['k']}, draft policy {c['draft_policy']}, "
        f"max {c['max_new_tokens']} new tokens",
        "",
        "| method | prompts | new tokens | decode tok/s | speedup (geomean of prompts, 95% CI) | tau | "
        "draft / accepted / cut tokens | valid | identical to plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in summary["methods"]:
        lo, hi = m["speedup_ci95"]
        lines.append(
            f"| {m['method']} | {m['prompts']} | {m['new_tokens']} | {m['decode_tokens_per_s']:.1f} | "
            f"{m['speedup_geomean']:.2f}x ({lo:.2f}–{hi:.2f}) | {m['tau']:.2f} | "
            f"{m['draft_tokens']} / {m['accepted_tokens']} / {m['cut_tokens']} | "
            f"{m['valid']}/{m['prompts']} | {m['identical']}/{m['prompts']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speculative.bench.constrained", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", action="append", help="drafter spec (repeatable; default ngram)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--draft-policy", default="adaptive", choices=("adaptive", "fixed"))
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--prompts", default=None, help="JSONL with id, prompt, schema (default: the project's 12)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--output", default=None, help="write the summary and every run as JSON here")
    args = ap.parse_args(argv)
    try:
        summary = run(args.target, args.drafter or ["ngram"], args.k, args.max_new_tokens, args.draft_policy,
                      args.limit, args.threads, args.prompts)
    except SpeculativeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(summary))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=1))
    bad = [m for m in summary["methods"] if m["identical"] != m["prompts"]]
    if bad:
        print(f"error: {', '.join(m['method'] for m in bad)} differ from plain constrained decoding", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
