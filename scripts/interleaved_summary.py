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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from speculative.bench.report import geometric_mean_ci  # noqa: E402  (the bench's own interval)


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    path = Path(sys.argv[1])
    if not path.is_file():
        sys.exit(f"error: {path} is not a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {path}: cannot read it ({e})")
    rounds: dict[int, dict[str, float]] = {}

    def number(x) -> float:  # a positive, finite number, or ValueError
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (x > 0 and math.isfinite(x)):
            raise ValueError(repr(x))
        return float(x)

    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}, line {i}: not JSON ({e})")
        try:
            if not isinstance(d, dict) or isinstance(d.get("round"), bool) or not isinstance(d.get("round"), int):
                raise KeyError("round")
            r = rounds.setdefault(d["round"], {})
            if str(d["peer"]).startswith("llama-bench"):
                if d.get("n_gen"):
                    r["peer n=1"] = round(1000.0 / number(d["avg_ts"]), 1)
                else:
                    r["peer n=512"] = round(number(d["avg_ns"]) / 1e6, 1)
            else:
                for n, t in d["profile"]["t_ms"].items():
                    r[f"ours n={n}"] = round(number(t), 1)
        except (KeyError, TypeError, AttributeError) as e:
            field = e.args[0] if isinstance(e, KeyError) else "its fields"
            sys.exit(f"error: {path}, line {i}: not a record of decode_vs_llama_bench.sh (a whole-number "
                     f"'round', 'peer', and llama-bench's or the profile's times; wrong or missing: {field})")
        except ValueError as e:
            sys.exit(f"error: {path}, line {i}: a time or rate that is not a positive, finite number: {e}")
    if not rounds:
        sys.exit(f"error: {path} holds no rounds")
    print("llama-bench (llama.cpp default build) vs ours (exact), per round: single-token step ms, 512-token prefill ms")
    for k in sorted(rounds):
        print(k, dict(sorted(rounds[k].items())))
    for n in ("1", "512"):
        ratios = [r[f"peer n={n}"] / r[f"ours n={n}"] for r in rounds.values()
                  if f"peer n={n}" in r and f"ours n={n}" in r]
        if len(ratios) < 2:
            print(f"n={n}: fewer than 2 paired rounds")
            continue
        g, lo, hi = geometric_mean_ci(ratios)
        print(f"n={n}: llama.cpp's time / ours {g:.3f} ({lo:.3f}-{hi:.3f}), "
              f"geometric mean of {len(ratios)} paired rounds, 95% t-interval")

if __name__ == "__main__":
    main()
