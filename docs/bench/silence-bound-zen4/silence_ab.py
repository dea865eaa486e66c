"""Interleaved A/B of the cross-request silencing rule for one drafter on the Qwen target, on the project's
development prompts (never Spec-Bench), greedy, every arm checked token for token against plain decoding.

Arms: plain decoding; the adaptive policy with the committed rule (a drafter is silenced once its average saving's
upper confidence bound is not positive: DraftPolicy.saving_bound); the adaptive policy with the earlier rule
(silenced while the average itself is not positive), emulated by overriding ``silenced``; a fixed draft of one
token (the head's ceiling under a policy that never backs off). Each arm has its own drafter and policy, kept across
the prompts as in a server or a bench run; the target and its cost table are shared; per prompt the arms run in a
rotating order. Writes OUT/runs.jsonl (one line per prompt and arm, resumable) and OUT/summary.txt: per arm, decode
time, tokens, steps, draft tokens verified and accepted, the prompts in which it drafted, and the paired per-prompt
decode-time ratio against plain decoding (geometric mean, 95% t-interval on the log scale, the bench's formula).

    .venv/bin/python docs/bench/silence-bound-zen4/silence_ab.py --out docs/bench/silence-bound-zen4/dev
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
from speculative.engine import SpeculativeGenerator
from speculative.policy import DraftPolicy


class EarlierRule(DraftPolicy):
    """The rule before this change: silenced while the average saving is not positive."""

    @property
    def silenced(self) -> bool:
        return self.saving is not None and self.saving <= 0.0


ARMS = [("plain", False, "fixed", 1), ("bound", True, "adaptive", 4), ("earlier", True, "adaptive", 4),
        ("fixed k=1", True, "fixed", 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--drafter", default="eagle:qwen2.5-coder-1.5b-instruct-eagle")
    ap.add_argument("--dataset", default="dev")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runs = a.out / "runs.jsonl"
    done = {}
    if runs.is_file():
        for line in runs.read_text().splitlines():
            r = json.loads(line)
            done[r["question_id"], r["arm"]] = r
    if done:
        print("note: resuming; the arms' policies start afresh, so the resumed part is not one run", file=sys.stderr)
    target = load_backend(a.target, "llama.cpp", n_ctx=4096, n_threads=a.threads, numerics="exact")
    cost = cached_verify_cost(target)
    table = {"start": {"sizes": list(cost.sizes), "seconds": list(cost.seconds)}}
    cfg = GenerationConfig().with_(max_new_tokens=a.max_new_tokens, temperature=0.0)
    ctx = BuildContext(backend="llama.cpp", n_threads=a.threads, numerics="exact", n_ctx=4096)
    gens = {}
    for name, drafted, _, _ in ARMS:
        gens[name] = SpeculativeGenerator(target, build_drafter(a.drafter, target, ctx) if drafted else NoDrafter(),
                                          cfg, cost_model=cost)
    gens["earlier"].policy.__class__ = EarlierRule
    questions = load_questions(a.dataset)
    with runs.open("a") as f:
        for qi, q in enumerate(questions):
            order = ARMS[qi % len(ARMS):] + ARMS[: qi % len(ARMS)]
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
                       "accepted_tokens": s.accepted_tokens, "silenced_after": gen.policy.silenced,
                       "saving_s": gen.policy.saving}
                done[q.question_id, name] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()
            print(f"{qi + 1}/{len(questions)}", file=sys.stderr, flush=True)
    table["end"] = {"sizes": list(cost.sizes), "seconds": list(cost.seconds), "as_read": cost.envelope()}
    (a.out / "cost-table.json").write_text(json.dumps(table, indent=1) + "\n")
    lines, differ = [], 0
    base = [done[q.question_id, "plain"] for q in questions]
    for name, *_ in ARMS:
        recs = [done[q.question_id, name] for q in questions]
        differ += sum(r["token_ids"] != b["token_ids"] for r, b in zip(recs, base))
        g, lo, hi = geometric_mean_ci([b["decode_s"] / r["decode_s"] for r, b in zip(recs, base)])
        tok, steps = sum(r["new_tokens"] for r in recs), sum(r["steps"] for r in recs)
        lines.append(f"{name:10s} decode {sum(r['decode_s'] for r in recs):7.1f} s  tokens {tok}  steps {steps}  "
                     f"tau {tok / steps:.3f}  drafted {sum(r['draft_tokens'] for r in recs)}  "
                     f"accepted {sum(r['accepted_tokens'] for r in recs)}  "
                     f"prompts drafted {sum(r['draft_tokens'] > 0 for r in recs)}/{len(recs)}  "
                     f"decode speedup over plain {g:.3f}x ({lo:.3f}-{hi:.3f})")
    for x, y in (("bound", "earlier"),):
        g, lo, hi = geometric_mean_ci([done[q.question_id, y]["decode_s"] / done[q.question_id, x]["decode_s"]
                                       for q in questions])
        lines.append(f"{x} over {y}, paired per prompt: {g:.3f}x ({lo:.3f}-{hi:.3f})")
    lines.append(f"prompts {len(questions)}; runs differing from plain greedy decoding: {differ}")
    (a.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
