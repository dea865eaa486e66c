"""Gate v18's first question for the head (Spec-Bench 81, both turns) through the bench's path with the gate's cost
table, every proposal and drafted step printed: ('P', budget, tokens proposed, min_confidence, confidences, drafting
ms, catch-up tokens, the request's draft cost estimate ms) and ('S', verified, accepted, tokens fed, forward ms,
drafting ms, the running saving ms, plain steps to skip next). WARM=1 runs the head once on zeros before the
request by hand (head.step on 32 zero features then on 1, its logits, softmax and top-k: the work Drafter.warm_up
does through propose since this folder's commit); without it the built-in warm-up is switched off, so that the run
is as before it. Debugging only; the runs in gate-question-steps.txt ran at commit 1844883 (before the warm-up).
Usage: [WARM=1] .venv/bin/python docs/bench/head-warmup-zen4/gate_question_steps.py"""
import json
from speculative.bench import BenchConfig, BenchRunner
from speculative.cost_model import CostModel
from speculative import policy as P
from speculative.drafters import heads
import os
if not os.environ.get('WARM'):
    heads._HeadDrafter.warm_up = lambda self: None  # as before the warm-up existed
log=[]
ob_prop=P.DraftPolicy.observe_proposal
def op(self, st, proposal, seconds, budget, min_conf):
    ob_prop(self, st, proposal, seconds, budget, min_conf)
    log.append(("P", budget, len(proposal.tokens), round(min_conf,3), [round(c,2) for c in (proposal.confidence or [])][:4], round(seconds*1e3,1), proposal.catchup_tokens, round(st.draft_cost*1e3,2)))
P.DraftPolicy.observe_proposal=op
ob_step=P.DraftPolicy.observe_step
def os_(self, st, verified, accepted, fed, forward_s, emitted=None):
    d=st.drafted_s
    ob_step(self, st, verified, accepted, fed, forward_s, emitted)
    if d>0: log.append(("S", verified, accepted, fed, round(forward_s*1e3,1) if forward_s else None, round(d*1e3,1), self.saving and round(self.saving*1e3,2), st.skip))
P.DraftPolicy.observe_step=os_
cfg = BenchConfig(target="qwen2.5-coder-1.5b-instruct", dataset="spec-bench+code", drafters=["eagle:qwen2.5-coder-1.5b-instruct-eagle"], categories=["mt_bench"], per_category=1, max_new_tokens=128, k=4, peers=[])
r = BenchRunner(cfg, output="/tmp/first-question-out", progress=False)
r.load_methods()
m = r.methods[1]
c = json.load(open("docs/bench/qwen-gate-v18-zen4/results.json"))["cost_model"]
m.gen._cost_model = CostModel(c["sizes"], c["seconds"])
q = r.questions[0]
import os, time
if os.environ.get('WARM'):
    import torch, numpy as np
    from speculative.drafters.head_nets import HeadCache
    d = m.gen.drafter
    t0=time.perf_counter()
    d._follow_target_threads()
    with torch.inference_mode():
        for n in (32, 1):
            f = torch.zeros(n, d.cfg.hidden_size)
            out = d.head.step(f, d.weights.embed_tokens(torch.zeros(n, dtype=torch.long)), HeadCache())
            p = d._probs(d._logits(out[-1])); torch.topk(p, max(1, d.tree))
    print('warm', time.perf_counter()-t0)
rec = m.run(q, r.gen_cfg)
p = m.gen.policy
print(q.question_id, "draft", rec.stats.draft_tokens, "acc", rec.stats.accepted_tokens, "steps", rec.stats.steps, "draft_s", rec.stats.draft_time_s, "saving", p.saving, "silenced", p.silenced)
for l in log[:60]: print(l)
r.close()
