"""Empirical acceptance of a model drafter per calibration bucket (decile of its probability, draft position):
accepted / observed given the tokens before were accepted, every proposal scored (shadow evaluation), under a
fixed draft of 4 tokens, development prompts FIRST..LAST-1, 128 tokens, greedy.
Usage: empirical.py DRAFTER FIRST LAST"""
import sys
from collections import defaultdict
from speculative.backends import load_backend
from speculative.bench.datasets import load_questions
from speculative.config import GenerationConfig
from speculative.cost_model import cached_verify_cost
from speculative.drafters import BuildContext, build_drafter
from speculative.engine import SpeculativeGenerator
from speculative.drafters import calibration as CAL

tot = defaultdict(lambda: [0.0, 0.0])
orig = CAL.AcceptanceCalibration.observe
def obs(self, bucket, ok):
    orig(self, bucket, ok)
    t = tot[bucket]; t[0] += ok; t[1] += 1
CAL.AcceptanceCalibration.observe = obs
target = load_backend("qwen2.5-coder-1.5b-instruct", "llama.cpp", n_ctx=4096, n_threads=2, numerics="exact")
cost = cached_verify_cost(target)
ctx = BuildContext(backend="llama.cpp", n_threads=2, numerics="exact", n_ctx=4096)
gen = SpeculativeGenerator(target, build_drafter(sys.argv[1], target, ctx),
                           GenerationConfig().with_(max_new_tokens=128),
                           cost_model=cost)
lo, hi = int(sys.argv[2]), int(sys.argv[3])
for q in load_questions("dev")[lo:hi]:
    gen.reset_caches()
    gen.generate([{"role": "user", "content": q.turns[0]}], chat=True, num_speculative_tokens=4, draft_policy="fixed")
print("table", [round(cost.time(n)*1000,1) for n in range(1,6)])
for p in range(4):
    print("pos", p, " ".join(f"{b}:{tot[(b,p)][0]:.0f}/{tot[(b,p)][1]:.0f}" for b in range(10)))
