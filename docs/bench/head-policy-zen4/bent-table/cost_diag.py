"""(Run with the code of commit 74d4a48, before the envelope: time() read the table as it stood.)
Which live forwards pull the shared cost table's T(n) up: per method and n, the forward times the engine
folds into the table (dev prompts, bench-like: one target, one cost model shared by every method)."""
import statistics
import sys
from collections import defaultdict
from speculative.backends import load_backend
from speculative.bench.datasets import load_questions
from speculative.config import GenerationConfig
from speculative.cost_model import cached_verify_cost, CostModel
from speculative.drafters import BuildContext, build_drafter
from speculative.drafters.base import NoDrafter
from speculative.engine import SpeculativeGenerator

SPECS = ["none", "ngram", "suffix", "eagle:qwen2.5-coder-1.5b-instruct-eagle",
         "suffix+eagle:qwen2.5-coder-1.5b-instruct-eagle,tree=3"]
nq = int(sys.argv[1]) if len(sys.argv) > 1 else 6
log = []
cur = {"m": None}
orig = CostModel.update
def upd(self, n, seconds):
    before = self.time(n)
    orig(self, n, seconds)
    log.append((cur["m"], n, seconds, before, self.time(n), self.time(1)))
CostModel.update = upd
orig_save = CostModel.save_if_drifted
def save(self, *a, **k):
    r = orig_save(self, *a, **k)
    if r:
        print("SAVED", cur["m"], [round(x * 1000, 1) for x in self.seconds], "live", sorted(self.live), file=sys.stderr)
    return r
CostModel.save_if_drifted = save
target = load_backend("qwen2.5-coder-1.5b-instruct", "llama.cpp", n_ctx=4096, n_threads=2, numerics="exact",
                      tree_width=3)
cost = cached_verify_cost(target)
print("start table", [round(cost.time(n) * 1000, 1) for n in (1, 2, 3, 4, 5, 8)], file=sys.stderr)
cfg = GenerationConfig().with_(max_new_tokens=128, temperature=0.0)
ctx = BuildContext(backend="llama.cpp", n_threads=2, numerics="exact", n_ctx=4096)
gens = {s: SpeculativeGenerator(target, NoDrafter() if s == "none" else build_drafter(s, target, ctx), cfg,
                                cost_model=cost) for s in SPECS}
for q in load_questions("dev")[:nq]:
    for s in SPECS:
        cur["m"] = s
        g = gens[s]
        g.reset_caches()
        g.generate([{"role": "user", "content": q.turns[0]}], chat=True, num_speculative_tokens=4,
                   draft_policy="adaptive" if s != "none" else "fixed")
    print(q.question_id, [round(cost.time(n) * 1000, 1) for n in (1, 2, 3, 4, 5, 8)], file=sys.stderr, flush=True)
pass  # (the full log went to /tmp/diag/log.json in the recorded run)
by = defaultdict(list)
for m, n, s, b, a, t1 in log:
    by[m, n].append(s * 1000)
for (m, n), v in sorted(by.items(), key=lambda x: (str(x[0][0]), x[0][1])):
    print(f"{m[:40]:40s} n={n:2d} count {len(v):4d} median {statistics.median(v):6.1f} ms  max {max(v):6.1f}  "
          f">50ms {sum(x > 50 for x in v)}")
