"""Summarize a run of scripts/decode_vs_llama_bench.sh: llama.cpp's time / ours, paired per round.

Usage: .venv/bin/python scripts/interleaved_summary.py RUN.jsonl
For each round: llama-bench's single-token step (1000 / tg64 tokens per second) and its 512-token prefill
(avg_ns), and ours (the profile's median T(1) and T(512)); then per size the ratio llama.cpp / ours (above 1:
ours is faster), its geometric mean over the rounds and a 95% t-interval (on the logarithms).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    path = Path(sys.argv[1])
    if not path.is_file():
        sys.exit(f"error: {path} is not a file")
    rounds: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        r = rounds.setdefault(d["round"], {})
        if d["peer"].startswith("llama-bench"):
            if d.get("n_gen"):
                r["peer n=1"] = round(1000.0 / d["avg_ts"], 1)
            else:
                r["peer n=512"] = round(d["avg_ns"] / 1e6, 1)
        else:
            prof = d["profile"]
            for n, t in prof["t_ms"].items():
                r[f"ours n={n}"] = round(t, 1)
    if not rounds:
        sys.exit(f"error: {path} holds no rounds")
    from scipy import stats

    print("llama-bench (llama.cpp default build) vs ours (exact), per round: single-token step ms, 512-token prefill ms")
    for k in sorted(rounds):
        print(k, dict(sorted(rounds[k].items())))
    for n in ("1", "512"):
        logs = [math.log(r[f"peer n={n}"] / r[f"ours n={n}"]) for r in rounds.values()
                if f"peer n={n}" in r and f"ours n={n}" in r]
        if len(logs) < 2:
            print(f"n={n}: fewer than 2 paired rounds")
            continue
        m = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
        half = stats.t.ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
        print(f"n={n}: llama.cpp's time / ours {math.exp(m):.3f} ({math.exp(m - half):.3f}-{math.exp(m + half):.3f}), "
              f"geometric mean of {len(logs)} paired rounds, 95% t-interval")


if __name__ == "__main__":
    main()
