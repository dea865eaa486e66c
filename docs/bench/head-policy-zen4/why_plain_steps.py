"""Why the adaptive policy decoded a step plainly, and each drafted step's measured net saving: one drafter,
the first N development prompts, 128 tokens, greedy, k = 4. Usage: why_plain_steps.py DRAFTER N"""
import sys

import numpy as np
from collections import Counter
from speculative import policy as P
from speculative.backends import load_backend
from speculative.bench.datasets import load_questions
from speculative.config import GenerationConfig
from speculative.cost_model import cached_verify_cost
from speculative.drafters import BuildContext, build_drafter
from speculative.engine import SpeculativeGenerator

C = Counter()
conf1 = []
orig_budget = P.DraftPolicy.draft_budget
def budget(self, st, m_max, stats, state, context):
    silent = st.silent
    skip = st.skip
    r = orig_budget(self, st, m_max, stats, state, context)
    if r == 0:
        C["plain: silent" if silent else "plain: skip (backing off)" if skip > 0 else "plain: cannot pay/other"] += 1
    else:
        C["drafter ran"] += 1
    return r
P.DraftPolicy.draft_budget = budget
orig_choose = P.DraftPolicy.choose
def choose(self, st, proposal, stats, **kw):
    r = orig_choose(self, st, proposal, stats, **kw)
    if proposal.tokens:
        C[f"verified {r} of {len(proposal.tokens)}"] += 1
        conf1.append(proposal.confidence[0])
    return r
P.DraftPolicy.choose = choose
orig_obs = P.DraftPolicy.observe_step
def obs(self, st, *a, **k):
    fo = st.first_ok
    orig_obs(self, st, *a, **k)
    if fo is False:
        C["first token below the threshold (a miss only where untimed)"] += 1
P.DraftPolicy.observe_step = obs

spec = sys.argv[1]
nq = int(sys.argv[2])
target = load_backend("qwen2.5-coder-1.5b-instruct", "llama.cpp", n_ctx=4096, n_threads=2, numerics="exact")
cost = cached_verify_cost(target)
ctx = BuildContext(backend="llama.cpp", n_threads=2, numerics="exact", n_ctx=4096)
gen = SpeculativeGenerator(target, build_drafter(spec, target, ctx), GenerationConfig().with_(max_new_tokens=128),
                           cost_model=cost)
sav = []
orig_os = P.DraftPolicy.observe_saving
def os_(self, seconds, tokens):
    sav.append(seconds)
    return orig_os(self, seconds, tokens)
P.DraftPolicy.observe_saving = os_
for q in load_questions("dev")[:nq]:
    gen.reset_caches()
    gen.generate([{"role": "user", "content": q.turns[0]}], chat=True, num_speculative_tokens=4,
                 draft_policy="adaptive")
for k, v in sorted(C.items()):
    print(f"{k:40s} {v}")
c = np.array(conf1)
print("first-token confidence quantiles", np.quantile(c, [0.1, 0.25, 0.5, 0.75, 0.9]).round(3) if len(c) else None)
print("table as read", [round(cost.time(n) * 1000, 1) for n in (1, 2, 3, 4, 5)])

sv = np.array(sav) * 1000
print("per-step saving ms: n", len(sv), "mean", sv.mean().round(2),
      "quantiles", np.quantile(sv, [0.1, 0.25, 0.5, 0.75, 0.9]).round(1))
print("T1 at end", round(cost.time(1) * 1000, 1), "ms; the policy's average saving", gen.policy.saving, "s")
