"""The head's first proposal in a fresh process, with and without the warm-up at load (Drafter.warm_up): one
development-set question (1000, two turns, 128 tokens each) through the bench's path, the Qwen target with its
shipped EAGLE head, adaptive policy, the machine's cached cost table. Prints one JSON line per run: the first
proposal's and the other proposals' median seconds (drafting time, catch-up included), draft tokens verified and
accepted, and whether the policy silenced the head at the end. Debugging evidence, one process per run.
Usage: .venv/bin/python docs/bench/head-warmup-zen4/first_proposal.py warm|cold"""
import json
import statistics
import sys

from speculative import policy
from speculative.bench import BenchConfig, BenchRunner
from speculative.drafters import heads

mode = sys.argv[1]
if mode == "cold":  # the code before the warm-up: nothing runs the head at load
    heads._HeadDrafter.warm_up = lambda self: None
seconds = []
observe = policy.DraftPolicy.observe_proposal


def spy(self, st, proposal, s, budget, min_conf):
    if proposal.tokens:
        seconds.append(s)
    return observe(self, st, proposal, s, budget, min_conf)


policy.DraftPolicy.observe_proposal = spy
cfg = BenchConfig(target="qwen2.5-coder-1.5b-instruct", dataset="dev",
                  drafters=["eagle:qwen2.5-coder-1.5b-instruct-eagle"], categories=["mt_bench"], per_category=1,
                  max_new_tokens=128, k=4, peers=[])
r = BenchRunner(cfg, output="/tmp/head-warmup-out", progress=False)
r.load_methods()
m = r.methods[1]
rec = m.run(r.questions[0], r.gen_cfg)
p = m.gen.policy
print(json.dumps({"mode": mode, "question": r.questions[0].question_id, "first_s": seconds[0] if seconds else None,
                  "rest_median_s": statistics.median(seconds[1:]) if len(seconds) > 1 else None,
                  "proposals": len(seconds), "draft_tokens": rec.stats.draft_tokens,
                  "accepted": rec.stats.accepted_tokens, "silenced": p.silenced, "saving_s": p.saving}))
r.close()
