"""The shipped Qwen head with the N most frequent tokens of its 16,384-token draft vocabulary (drafter option
vocab=N): tau at k = 4 and drafting cost on the 38 development prompts (greedy, fixed policy, 64 new tokens),
every prompt run with each N in turn (rotating order), one generator per N.

usage: python vocab.py OUT.json N1 N2 ...
"""
import json
import sys

from speculative import SpeculativeGenerator
from speculative.bench.datasets import load_questions
from speculative.stats import GenerationStats
from speculative.training.train import pick_inference_precision

out, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
head = "eagle:qwen2.5-coder-1.5b-instruct-eagle"
gens = {n: SpeculativeGenerator.from_pretrained("qwen2.5-coder-1.5b-instruct", drafter=f"{head},vocab={n}", n_ctx=2048)
        for n in sizes}
stats = {n: GenerationStats() for n in sizes}
for i, q in enumerate(load_questions("dev")):
    order = sizes[i % len(sizes):] + sizes[: i % len(sizes)]
    for n in order:
        r = gens[n].generate(q.turns[0], max_new_tokens=64, num_speculative_tokens=4, draft_policy="fixed")
        stats[n].merge(r.stats)
    print(i, {n: round(stats[n].mean_accepted_tokens, 3) for n in sizes}, flush=True)
for g in gens.values():
    g.close()
rows = {str(n): {"mean_accepted_tokens": s.mean_accepted_tokens, "per_position_acceptance": s.per_position_acceptance,
                 "new_tokens": s.new_tokens, "steps": s.steps, "draft_tokens": s.draft_tokens,
                 "draft_time_s": s.draft_time_s, "verify_time_s": s.verify_time_s,
                 "draft_ms_per_token": 1e3 * s.draft_time_s / max(1, s.draft_tokens),
                 "verify_ms_per_step": 1e3 * s.verify_time_s / max(1, s.steps)} for n, s in stats.items()}
best, rates = pick_inference_precision(rows)
json.dump({"drafter": head, "sizes": rows, "estimated": rates, "fastest": best}, open(out, "w"), indent=1)
print(json.dumps({n: {k: rows[n][k] for k in ("mean_accepted_tokens", "draft_ms_per_token", "verify_ms_per_step")}
                  for n in rows}, indent=1), rates)
