"""Summarize a run of scripts/decode_vs_llama_bench.sh: llama.cpp's time / ours, paired per round.

Usage: .venv/bin/python scripts/interleaved_summary.py RUN.jsonl
For each round: llama-bench's single-token step (1000 / tg64 tokens per second) and its 512-token prefill
(avg_ns), and ours (the profile's median T(1) and T(512)); then per size the ratio llama.cpp / ours (above 1:
ours is faster), its geometric mean over the rounds and a 95% t-interval (on the logarithms).
"""

from __future__ import annotations

import json
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
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            r = rounds.setdefault(d["round"], {})
            if d["peer"].startswith("llama-bench"):
                if d.get("n_gen"):
                    r["peer n=1"] = round(1000.0 / d["avg_ts"], 1)
                else:
                    r["peer n=512"] = round(d["avg_ns"] / 1e6, 1)
            else:
                for n, t in d["profile"]["t_ms"].items():
                    r[f"ours n={n}"] = round(t, 1)
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}, line {i}: not JSON ({e})")
        except (KeyError, TypeError, AttributeError) as e:
            sys.exit(f"error: {path}, line {i}: not a record of decode_vs_llama_bench.sh (no {e})")
        except ZeroDivisionError:
            sys.exit(f"error: {path}, line {i}: llama-bench's rate is 0")
        if any(not v > 0 for v in r.values()):
            sys.exit(f"error: {path}, line {i}: a time that is not positive")
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
