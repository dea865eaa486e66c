"""Decoding speed with the thread count left to the governor, fixed at the cores, and fixed at 1, on an
idle machine and on one whose cores another process keeps busy (docs/policy.md, "Threads").

Usage: .venv/bin/python scripts/busy_threads.py OUT.jsonl [--target NAME] [--rounds R] [--busy N]
       [--max-new-tokens N] [--conditions idle,busy] [--arms A,B]
       .venv/bin/python scripts/busy_threads.py OUT.jsonl --summary   (the table docs/policy.md quotes)

Each run is one `speculative generate --json` in a fresh process (the demo's prompt, greedy, the
target's default drafter, or --drafter none), so the governor starts from nothing as it does for a user.
Arms run in interleaved rounds; "busy" starts N spinning Python processes (one per core by default)
for the duration of the round. Writes one JSON line per run: condition, arm, round and the run's stats.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from speculative.backends.threads import default_threads  # noqa: E402

ALL = str(default_threads())  # the physical cores: what the engine uses when no count is given
ARMS = {
    "governed": [],
    "threads=all": ["--threads", ALL],
    "threads=1": ["--threads", "1"],
    "plain governed": ["--drafter", "none"],
    "plain threads=all": ["--drafter", "none", "--threads", ALL],
}


def spin() -> None:  # pragma: no cover - a load generator
    while True:
        pass


def prompt() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    return demo.PROMPT


def one_run(target: str, arm: list[str], max_new: int, text: str) -> dict:
    cmd = [str(ROOT / ".venv/bin/speculative"), "generate", "--target", target, "--max-new-tokens", str(max_new),
           "--json", *arm, text]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["stats"]


def summary(path: Path) -> str:
    """Per condition: each arm's median decode rate and end-to-end time (medians over its runs), and its
    speedup over the same drafter at a fixed count of all cores (wall times paired per round; geometric
    mean, 95% t-interval)."""
    from speculative.bench.report import geometric_mean_ci

    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    lines = ["| condition | arm | runs | decode tok/s (median) | wall s (median) "
             "| end to end over the same drafter at threads=all |", "|---|---|---|---|---|---|"]
    for cond in dict.fromkeys(r["condition"] for r in rows):
        by = {}
        for r in rows:
            if r["condition"] == cond:
                by.setdefault(r["arm"], {})[(r["target"], r["round"])] = r["stats"]
        for arm, runs in by.items():
            ref_arm = "plain threads=all" if arm.startswith("plain") else "threads=all"
            ref = by.get(ref_arm, {})
            dec = sorted(s["decode_tokens_per_second"] for s in runs.values())
            wall = sorted(s["wall_time_s"] for s in runs.values())
            pairs = [ref[k]["wall_time_s"] / runs[k]["wall_time_s"] for k in runs if k in ref]
            if arm != ref_arm and len(pairs) >= 2:
                g, lo, hi = geometric_mean_ci(pairs)
                sp = f"{g:.2f}x ({lo:.2f}-{hi:.2f})"
            else:
                sp = "-"
            mid = len(dec) // 2
            lines.append(f"| {cond} | {arm} | {len(runs)} | {dec[mid]:.1f} | {wall[mid]:.2f} | {sp} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes when busy")
    ap.add_argument("--max-new-tokens", type=int, default=150)
    ap.add_argument("--conditions", default="idle,busy")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--summary", action="store_true", help="print the table of an existing OUT.jsonl")
    a = ap.parse_args()
    if a.summary:
        print(summary(Path(a.out)))
        return
    text = prompt()
    arms = a.arms.split(",")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for r in range(a.rounds):
            for cond in a.conditions.split(","):
                load = [mp.Process(target=spin, daemon=True) for _ in range(a.busy if cond == "busy" else 0)]
                for p in load:
                    p.start()
                try:
                    for arm in arms:
                        s = one_run(a.target, ARMS[arm], a.max_new_tokens, text)
                        row = {"condition": cond, "arm": arm, "round": r, "target": a.target, "stats": s}
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        print(f"round {r} {cond:4s} {arm:18s} wall {s['wall_time_s']:6.2f} s  "
                              f"decode {s['decode_tokens_per_second']:6.1f} tok/s", flush=True)
                finally:
                    for p in load:
                        p.terminate()
                        p.join()


if __name__ == "__main__":
    main()
