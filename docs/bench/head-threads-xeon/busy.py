"""Drafting time of an EAGLE head on a busy machine: PyTorch following the target's thread count (the head's
_follow_target_threads) against PyTorch's default of one thread per core, alternating, one run each per round.

usage: python busy.py TARGET DRAFTER ROUNDS OUT.json [OTHER]   (busy: run it beside a process that keeps one core busy)
OTHER: per-core (default: PyTorch's one thread per core) or one (a single PyTorch thread, for a quiet machine)
"""
import json
import sys
import time

import torch

from speculative import SpeculativeGenerator
from speculative.bench.datasets import load_questions

target, drafter, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
other = sys.argv[5] if len(sys.argv) > 5 else "per-core"
gen = SpeculativeGenerator.from_pretrained(target, drafter=drafter, n_ctx=1024)
d = gen.drafter
follow = d._follow_target_threads
prompts = [q.turns[0] for q in load_questions("dev")[:3]]
rows = []
for r in range(rounds):
    for mode in ("follow", other) if r % 2 == 0 else (other, "follow"):
        if mode == "follow":
            d._follow_target_threads = follow
        else:
            d._follow_target_threads = lambda: None
            torch.set_num_threads(1 if mode == "one" else 2)
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            res = gen.generate(p, max_new_tokens=64, num_speculative_tokens=4, draft_policy="fixed")
            s = res.stats
            rows.append({"round": r, "mode": mode, "prompt": i, "wall_s": time.perf_counter() - t0,
                         "draft_s": s.draft_time_s, "verify_s": s.verify_time_s, "draft_tokens": s.draft_tokens,
                         "new_tokens": s.new_tokens, "torch_threads": torch.get_num_threads(),
                         "target_threads": gen.target.cpu_threads_now()})
            print(rows[-1], flush=True)
gen.close()
json.dump(rows, open(out, "w"), indent=1)
