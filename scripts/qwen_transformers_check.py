"""The Qwen2.5-Coder pair on the transformers backend (CPU, fp32 de-quantized GGUFs).

Loads the 1.5B target and the 0.5B draft model through transformers' GGUF loader (the first
run converts both into the model cache), then, for a few code prompts, decodes plainly and
with the draft model (``draft_policy`` fixed and adaptive, k = 4) and prints one JSON line
per run: whether the output equals plain greedy, times, draft tokens, alpha, tau. At the end:
peak RSS and the size of each converted folder (GiB). Exit status 1 if any output differs.

    .venv/bin/python scripts/qwen_transformers_check.py [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from speculative import SpeculativeGenerator
from speculative.cache import cache_dir

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain what a Python list comprehension is, with one example.",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    t0 = time.perf_counter()
    gen = SpeculativeGenerator.from_pretrained(
        "qwen2.5-coder-1.5b-instruct", drafter="model:qwen2.5-coder-0.5b-instruct",
        backend="transformers", device="cpu", n_ctx=1024,
    )
    print(json.dumps({"load_s": round(time.perf_counter() - t0, 1)}), flush=True)
    plain = SpeculativeGenerator(gen.target)
    same = True
    for prompt in PROMPTS:
        ref = plain.generate(prompt, max_new_tokens=args.max_new_tokens)
        for policy in ("fixed", "adaptive"):
            r = gen.generate(prompt, max_new_tokens=args.max_new_tokens, num_speculative_tokens=4, draft_policy=policy)
            s = r.stats
            same &= r.token_ids == ref.token_ids
            print(json.dumps(dict(
                prompt=prompt[:40], policy=policy, identical=r.token_ids == ref.token_ids, new_tokens=len(r.token_ids),
                plain_s=round(ref.stats.wall_time_s, 2), spec_s=round(s.wall_time_s, 2), draft_tokens=s.draft_tokens,
                accepted=s.accepted_tokens, alpha=round(s.acceptance_rate, 3), tau=round(s.mean_accepted_tokens, 2),
            )), flush=True)
    converted = {d.name: round(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 2**30, 2)
                 for d in cache_dir("hf-converted").iterdir() if d.name.startswith("qwen2.5-coder")}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"peak_rss_gib": round(peak, 2), "converted_gib": converted}), flush=True)
    gen.close()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
