"""Why the head sat out the gate: its first question (Spec-Bench 81) replayed through the bench's path, once with the
cost table the gate measured at its start (results.json) and once without (the table cached now). Debugging only.
Usage: .venv/bin/python docs/bench/qwen-gate-v18-zen4/head-silenced/first_question.py [gate]"""
import sys
from speculative.bench import BenchConfig, BenchRunner
cfg = BenchConfig(target="qwen2.5-coder-1.5b-instruct", dataset="spec-bench+code", drafters=["eagle:qwen2.5-coder-1.5b-instruct-eagle"], categories=["mt_bench"], per_category=1, max_new_tokens=128, k=4, peers=[])
r = BenchRunner(cfg, output="/tmp/first-question-out", progress=False)
r.load_methods()
print("cost", [round(x*1e3,1) for x in r.cost_model.seconds][:6])
m = r.methods[1]
import json
from speculative.cost_model import CostModel
if len(sys.argv) > 1 and sys.argv[1] == "gate":
  c = json.load(open("docs/bench/qwen-gate-v18-zen4/results.json"))["cost_model"]
  m.gen._cost_model = CostModel(c["sizes"], c["seconds"])
  print("gate cost", [round(x*1e3,1) for x in c["seconds"]][:6])
q = r.questions[0]
rec = m.run(q, r.gen_cfg)
p = m.gen.policy
print(q.question_id, "draft", rec.stats.draft_tokens, "acc", rec.stats.accepted_tokens, "steps", rec.stats.steps, "draft_s", rec.stats.draft_time_s, "saving", p.saving, "silenced", p.silenced, p.accepts, p.rejects)
r.close()
