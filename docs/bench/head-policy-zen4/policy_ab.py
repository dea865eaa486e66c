"""Interleaved A/B of draft policies for one drafter on the Qwen target: the adaptive policy at k = 4 against
fixed draft lengths, on the project's development prompts (never Spec-Bench), greedy, every arm checked
token for token against plain decoding.

Each arm has its own drafter (so its own adaptive-policy state, kept across requests as in a server); the
target and its measured cost table are shared. Per prompt the arms run in a rotating order. Writes one JSON
line per (prompt, arm) to OUT/runs.jsonl (resumable: done lines are skipped) and OUT/summary.txt: per arm,
decode time summed over prompts, tokens, steps, draft tokens verified and accepted, τ (new tokens per
target forward), and the paired per-prompt decode-time ratio against plain decoding (geometric mean,
95% t-interval on the log scale, the bench's formula).

    .venv/bin/python docs/bench/head-policy-zen4/policy_ab.py --drafter eagle:qwen2.5-coder-1.5b-instruct-eagle \
        --out docs/bench/head-policy-zen4/eagle --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speculative.backends import load_backend
from speculative.bench.datasets import load_questions
from speculative.bench.report import geometric_mean_ci
from speculative.config import GenerationConfig
from speculative.cost_model import cached_verify_cost
from speculative.drafters import BuildContext, build_drafter
from speculative.drafters.base import NoDrafter
from speculative.drafters.calibration import CONFIDENCE_PRIORS, MEMORY_WEIGHT, AcceptanceCalibration
from speculative.engine import SpeculativeGenerator

ARMS = [("plain", None, "fixed", 1), ("adaptive k=4", True, "adaptive", 4), ("fixed k=1", True, "fixed", 1),
        ("fixed k=2", True, "fixed", 2), ("fixed k=3", True, "fixed", 3),
        # the calibration's earlier rules, emulated here (see old_calibration): a fresh calibration per request,
        # and the drafter drafting on while the cumulative confidence is at least the policy's threshold;
        # "kept old-stop": the calibration kept across requests, the old stopping rule
        ("per-request", "per-request", "adaptive", 4), ("kept old-stop", "old-stop", "adaptive", 4)]


class _OldStop(AcceptanceCalibration):
    """The stopping rule before the calibration was kept: draft on while cum >= min_confidence."""

    def worth_drafting(self, cum: float, position: int, min_confidence: float) -> bool:
        return min_confidence <= 0.0 or cum >= min_confidence


class _OneCalibration:
    """Stands in for a drafter's TenantCalibrations: the same calibration for every request, or a fresh one."""

    def __init__(self, fresh: bool):
        self.fresh, self.cal = fresh, _OldStop(prior=CONFIDENCE_PRIORS, max_weight=MEMORY_WEIGHT)

    def get(self, tenant: str = "") -> AcceptanceCalibration:
        return _OldStop(prior=CONFIDENCE_PRIORS) if self.fresh else self.cal


def old_calibration(drafter, variant: str) -> None:
    """Give ``drafter`` the old stopping rule, and with ``variant`` "per-request" a fresh calibration per request."""
    drafter.calibrations = _OneCalibration(fresh=variant == "per-request")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--dataset", default="dev")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", default=",".join(name for name, *_ in ARMS), help="comma-separated arm names")
    a = ap.parse_args()
    wanted = a.arms.split(",")
    unknown = sorted(set(wanted) - {name for name, *_ in ARMS})
    if unknown:
        ap.error(f"unknown arm(s) {unknown}; the arms are {[name for name, *_ in ARMS]}")
    arms = [arm for arm in ARMS if arm[0] in wanted]
    a.out.mkdir(parents=True, exist_ok=True)
    runs = a.out / "runs.jsonl"
    done = {}
    if runs.is_file():
        for line in runs.read_text().splitlines():
            r = json.loads(line)
            done[r["question_id"], r["arm"]] = r
    target = load_backend(a.target, "llama.cpp", n_ctx=4096, n_threads=a.threads, numerics="exact")
    cost = cached_verify_cost(target)
    table = {"start": {"sizes": list(cost.sizes), "seconds": list(cost.seconds)}}
    cfg = GenerationConfig().with_(max_new_tokens=a.max_new_tokens, temperature=0.0)
    ctx = BuildContext(backend="llama.cpp", n_threads=a.threads, numerics="exact", n_ctx=4096)
    gens = {}
    for name, drafted, _, _ in arms:
        drafter = build_drafter(a.drafter, target, ctx) if drafted else NoDrafter()
        if isinstance(drafted, str):
            old_calibration(drafter, drafted)
        gens[name] = SpeculativeGenerator(target, drafter, cfg, cost_model=cost)
    questions = load_questions(a.dataset)
    with runs.open("a") as f:
        for qi, q in enumerate(questions):
            order = arms[qi % len(arms):] + arms[: qi % len(arms)]
            for name, _, policy, k in order:
                if (q.question_id, name) in done:
                    continue
                gen = gens[name]
                gen.reset_caches()
                r = gen.generate([{"role": "user", "content": q.turns[0]}], chat=True, draft_policy=policy,
                                 num_speculative_tokens=k, max_new_tokens=a.max_new_tokens)
                s = r.stats
                rec = {"question_id": q.question_id, "category": q.category, "arm": name,
                       "token_ids": list(r.token_ids), "decode_s": s.wall_time_s - s.prefill_time_s,
                       "new_tokens": s.new_tokens, "steps": s.steps, "draft_tokens": s.draft_tokens,
                       "accepted_tokens": s.accepted_tokens}
                done[q.question_id, name] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()
            print(f"{qi + 1}/{len(questions)}", file=sys.stderr, flush=True)
    table["end"] = {"sizes": list(cost.sizes), "seconds": list(cost.seconds), "as_read": cost.envelope()}
    (a.out / "cost-table.json").write_text(json.dumps(table, indent=1) + "\n")
    lines, differ = [], 0
    for name, _, policy, k in arms:
        recs = [done[q.question_id, name] for q in questions]
        base = [done[q.question_id, "plain"] for q in questions]
        differ += sum(r["token_ids"] != b["token_ids"] for r, b in zip(recs, base))
        g, lo, hi = geometric_mean_ci([b["decode_s"] / r["decode_s"] for r, b in zip(recs, base)])
        tok, steps = sum(r["new_tokens"] for r in recs), sum(r["steps"] for r in recs)
        lines.append(f"{name:14s} decode {sum(r['decode_s'] for r in recs):7.1f} s  tokens {tok}  steps {steps}  "
                     f"tau {tok / steps:.3f}  drafted {sum(r['draft_tokens'] for r in recs)}  "
                     f"accepted {sum(r['accepted_tokens'] for r in recs)}  "
                     f"decode speedup over plain {g:.3f}x ({lo:.3f}-{hi:.3f})")
    lines.append(f"prompts {len(questions)}; runs differing from plain greedy decoding: {differ}")
    (a.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
