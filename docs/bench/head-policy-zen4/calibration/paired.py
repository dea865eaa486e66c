"""Paired per-prompt decode-time ratios between arms of a policy_ab.py run (geometric mean, 95% t-interval on the
log scale). Usage: paired.py RUNS.jsonl "ARM A/ARM B" ...: how much faster A decoded than B."""
import json, sys
from speculative.bench.report import geometric_mean_ci
runs = [json.loads(l) for l in open(sys.argv[1])]
d = {(r["question_id"], r["arm"]): r for r in runs}
qs = sorted({r["question_id"] for r in runs})
for a, b in [x.split("/") for x in sys.argv[2:]]:
    g, lo, hi = geometric_mean_ci([d[q, b]["decode_s"] / d[q, a]["decode_s"] for q in qs])
    print(f"{a} over {b}: {g:.3f}x ({lo:.3f}-{hi:.3f})")
