"""Plot a drafter's learning curve from training runs: held-out tau (development prompts, greedy, k = 4)
against the training tokens, with each point's cost in CPU-hours, and extrapolate (log-linear fit).

    python scripts/learning_curve.py RUN_FOLDER... --out docs/bench/qwen-eagle-curve

Each RUN_FOLDER is a ``speculative train-drafter`` run (its ``metrics.json``). Writes ``curve.json``
(the points, the fit, the tokens the fit says tau = 3.0 needs) and ``curve.png`` under ``--out``.
The CPU-hours of a point are its training time plus the share of data generation its tokens used
(wall seconds x cores / 3600, with the cores of this machine; ``--data-seconds-per-token`` when the
runs share one data folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path


def points(runs: list[Path]) -> list[dict]:
    out = []
    for run in runs:
        m = json.loads((run / "metrics.json").read_text())
        cfg = json.loads((run / "train_config.json").read_text())
        h = m["heldout"]
        out.append({
            "run": run.name, "tokens": m["tokens"], "examples": m["examples"], "epochs": cfg["epochs"],
            "tau": h["mean_accepted_tokens"], "tau_per_draft_step": h["mean_accepted_tokens_per_draft_step"],
            "acceptance_rate": h["acceptance_rate"], "per_position_acceptance": h["per_position_acceptance"],
            "train_seconds": m["train_seconds"], "data_seconds": m["data_seconds"],
            "precision": m.get("precision", "fp32"),
        })
    return sorted(out, key=lambda p: p["tokens"])


def fit(pts: list[dict]) -> dict | None:
    """Least-squares tau = a + b * log2(tokens); None with fewer than two points."""
    if len(pts) < 2:
        return None
    xs = [math.log2(p["tokens"]) for p in pts]
    ys = [p["tau"] for p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    need = 2 ** ((3.0 - a) / b) if b > 0 else None
    return {"model": "tau = a + b * log2(tokens)", "a": a, "b_per_doubling": b, "tokens_for_tau_3": need}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--data-seconds-per-token", type=float, default=None,
                    help="wall seconds the shared data folder took per token (when runs reuse one with --data-from)")
    args = ap.parse_args()
    pts = points(args.runs)
    for p in pts:
        if args.data_seconds_per_token is not None:
            p["data_seconds"] = p["tokens"] * args.data_seconds_per_token
        p["cpu_hours"] = (p["train_seconds"] + p["data_seconds"]) * args.cores / 3600
    f = fit(pts)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "curve.json").write_text(json.dumps({"points": pts, "fit": f, "cores": args.cores}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["tokens"] for p in pts], [p["tau"] for p in pts], "o-", label="measured (dev set, k = 4)")
    for p in pts:
        ax.annotate(f"{p['cpu_hours']:.1f} CPU-h", (p["tokens"], p["tau"]), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)
    if f and f["tokens_for_tau_3"]:
        x0, x1 = pts[0]["tokens"], max(pts[-1]["tokens"] * 4, min(f["tokens_for_tau_3"], pts[-1]["tokens"] * 1024))
        xs = [x0 * (x1 / x0) ** (i / 40) for i in range(41)]
        ax.plot(xs, [f["a"] + f["b_per_doubling"] * math.log2(x) for x in xs], "--", color="gray",
                label=f"log-linear fit: +{f['b_per_doubling']:.2f} per doubling")
    ax.axhline(3.0, color="red", lw=0.8, ls=":", label="goal: tau 3.0")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (target features)")
    ax.set_ylabel("tau: mean accepted tokens per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "curve.png", dpi=110)
    print(json.dumps({"points": [(p["tokens"], round(p["tau"], 3), round(p["cpu_hours"], 2)) for p in pts], "fit": f}))


if __name__ == "__main__":
    main()
