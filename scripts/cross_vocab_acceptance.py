"""Acceptance of draft models with another tokenizer: alpha and tau at fixed k, greedy, no timing.

For each prompt the target decodes plainly (greedy) once; then, for each k, the fixed-k
chain is replayed step by step: the cross-vocabulary drafter proposes min(k, budget)
tokens after the committed context, the accepted prefix is the part equal to the plain
greedy tokens, and the next step starts after it and the bonus token. Under greedy
verification this is exactly what ``draft_policy="fixed"`` records (the drafter sees the
same contexts), without the target's verification passes.

    .venv/bin/python scripts/cross_vocab_acceptance.py --target gemma-3-270m \
        --drafter smollm2-135m-instruct --per-category 2 --max-new-tokens 64

alpha = accepted / drafted; tau = new tokens / target steps (the prefill step included),
as the bench reports them.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from speculative.backends import load_backend
from speculative.bench.datasets import load_questions
from speculative.config import SamplingParams
from speculative.drafters import build_drafter
from speculative.drafters.base import NoDrafter
from speculative.engine import SpeculativeGenerator
from speculative.sampling import Sampler


def replay(drafter, ids, messages, cont, k):
    """(steps, drafted, accepted) of a fixed-k greedy run whose output is ``cont``."""
    sampler = Sampler(SamplingParams(temperature=0.0))
    rng = np.random.default_rng(0)
    st = drafter.start(ids, messages)
    steps, drafted, accepted, i, n = 1, 0, 0, 1, len(cont)
    try:
        while i < n:
            m = min(k, n - i - 1)
            toks = []
            if m > 0:
                toks = [int(t) for t in drafter.propose(st, ids + cont[:i], m, sampler, rng).tokens[:m]]
            a = 0
            while a < len(toks) and toks[a] == cont[i + a]:
                a += 1
            steps += 1
            drafted += len(toks)
            accepted += a
            i += a + 1
    finally:
        drafter.finish(st)
    return steps, drafted, accepted


def sampling_acceptance(target, text_drafter, tli_drafter, ids, messages, cont, params):
    """Per position of the greedy continuation, the expected acceptance of the first draft token under
    sampling: sum_x min(p(x), q(x)) for TLI's restricted q, p(x) for the text bridge's one-hot draft x.
    Returns (sum for TLI, sum for text, positions)."""
    from speculative.backends.base import ForwardRequest

    s = Sampler(params)
    rng = np.random.default_rng(0)
    n = len(cont)
    target.truncate(0, 0)
    rows = target.forward([ForwardRequest(0, ids + cont[:-1], logits=[len(ids) - 1 + i for i in range(n)])])[0].logits
    rows = np.array(rows, copy=True)
    target.truncate(0, 0)
    st_t = text_drafter.start(ids, messages)
    st_i = tli_drafter.start(ids, messages)
    a_tli = a_text = 0.0
    try:
        for i in range(1, n):
            ctx = ids + cont[:i]
            p = s.probs(rows[i])
            q = tli_drafter.propose(st_i, ctx, 1, s, rng).probs
            a_tli += float(np.minimum(p, q[0]).sum()) if q is not None else 0.0
            toks = text_drafter.propose(st_t, ctx, 1, s, rng).tokens
            a_text += float(p[toks[0]]) if toks else 0.0
    finally:
        text_drafter.finish(st_t)
        tli_drafter.finish(st_i)
    return a_tli, a_text, n - 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="draft model name; vocab=... may follow after a comma")
    ap.add_argument("--dataset", default="spec-bench")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--sampling", default="", help="temperatures: also the first draft token's expected "
                    "acceptance under sampling, TLI against the text bridge (e.g. 0.7,1.0)")
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    target = load_backend(a.target, n_ctx=4096, n_threads=a.threads)
    spec = f"model:{a.drafter}" + (f",threads={a.threads}" if a.threads else "")
    drafter = build_drafter(spec, target)
    plain = SpeculativeGenerator(target, NoDrafter())
    temps = [float(x) for x in a.sampling.split(",") if x]
    if temps:
        text_d = build_drafter(spec + ",vocab=text", target)
        tli_d = build_drafter(spec + ",vocab=intersect", target)
    samp = {t: [0.0, 0.0, 0] for t in temps}
    chat = target.chat_template is not None
    seen: dict[str, int] = {}
    totals = {k: [0, 0, 0, 0] for k in ks}  # steps, drafted, accepted, new tokens
    per_cat: dict[str, dict[int, list[int]]] = {}
    t0 = time.time()
    for q in load_questions(a.dataset):
        if seen.get(q.category, 0) >= a.per_category:
            continue
        seen[q.category] = seen.get(q.category, 0) + 1
        messages = [{"role": "user", "content": q.turns[0]}] if chat else None
        ids = plain.encode_prompt(messages or q.turns[0])
        cont = plain.generate(ids, max_new_tokens=a.max_new_tokens).token_ids
        for k in ks:
            s, d, acc = replay(drafter, ids, messages, cont, k)
            for agg in (totals[k], per_cat.setdefault(q.category, {}).setdefault(k, [0, 0, 0, 0])):
                agg[0] += s
                agg[1] += d
                agg[2] += acc
                agg[3] += len(cont)
        for temp in temps:
            r = sampling_acceptance(target, text_d, tli_d, ids, messages, cont, SamplingParams(temperature=temp))
            for j in range(3):
                samp[temp][j] += r[j]
        print(f"{q.category} q{q.question_id}: {len(cont)} tokens ({time.time() - t0:.0f} s)", flush=True)
    out = {"target": a.target, "drafter": drafter.description, "prompts": sum(seen.values()),
           "max_new_tokens": a.max_new_tokens, "overall": {}, "per_category": {}}
    for k, (s, d, acc, n) in totals.items():
        out["overall"][k] = {"alpha": acc / max(d, 1), "tau": n / max(s, 1), "drafted": d, "accepted": acc}
        print(f"k={k}: alpha {acc / max(d, 1):.3f}, tau {n / max(s, 1):.2f} ({acc}/{d} accepted, {n} tokens, {s} steps)")
    out["sampling_first_token"] = {}
    for temp, (ti, tx, n) in samp.items():
        out["sampling_first_token"][temp] = {"tli": ti / max(n, 1), "text": tx / max(n, 1), "positions": n}
        print(f"T={temp}: expected acceptance of the first draft token: TLI {ti / max(n, 1):.3f}, "
              f"text bridge (one-hot) {tx / max(n, 1):.3f} ({n} positions)")
    for cat, rows in per_cat.items():
        out["per_category"][cat] = {k: {"alpha": r[2] / max(r[1], 1), "tau": r[3] / max(r[0], 1)} for k, r in rows.items()}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(out, f, indent=1)
    drafter.close()
    target.close()


if __name__ == "__main__":
    main()
