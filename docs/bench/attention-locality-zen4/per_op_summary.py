"""Per-op times of two builds side by side, from per-op/ files (per-op-loop.py output of test-only timing builds).

Usage: python3 per_op_summary.py FOLDER A B FORWARDS [OP]  (e.g. per-op 15 16 200): ms per forward, thread 0 /
thread 1, the mean of the rounds, for each model and forward size in the folder. With OP (e.g. MUL_MAT), also that
op's time per round (the two threads' mean) for each build, and the ratio A / B paired by round with its 95%
interval (a t interval on the log ratios), the same for the graph's total (all ops and waits, thread 0) and
the forward's median.
"""
import collections
import glob
import re
import statistics
import sys

folder, va, vb, forwards = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
op_of_interest = sys.argv[5] if len(sys.argv) > 5 else None


def paired(a, b):
    """Ratio a / b paired by round: geometric mean and 95% t interval (rounds > 1)."""
    import math
    from scipy import stats
    logs = [math.log(x / y) for x, y in zip(a, b)]
    m = statistics.mean(logs)
    if len(logs) < 2:
        return f"{math.exp(m):.3f}x"
    h = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return f"{math.exp(m):.3f}x ({math.exp(m - h):.3f}-{math.exp(m + h):.3f}), {len(logs)} rounds"


def parse(f):
    d, med = {}, None
    for line in open(f):
        if 'median' in line:
            med = float(re.search(r'median ([\d.]+)', line).group(1))
        m = re.match(r'(\S+)\s+\|\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+\|\s+(\d+)\s+([\d.]+)\s+([\d.]+)', line)
        if m:
            d[m.group(1)] = tuple(float(m.group(i)) / forwards for i in (3, 4, 6, 7))
    return med, d


for model in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
    for n in (1, 8):
        rows, meds = collections.defaultdict(dict), {}
        for v in (va, vb):
            parsed = [parse(f) for f in sorted(glob.glob(f"{folder}/{v}-{model}-n{n}-round*.txt"))]
            if not parsed:
                continue
            meds[v] = [p[0] for p in parsed]
            for op in parsed[0][1]:
                vals = [p[1][op] for p in parsed if op in p[1]]
                rows[op][v] = tuple(statistics.mean(x) for x in zip(*vals))
        if not meds:
            continue
        print(f"== {model}, {n}-token forwards: ms per forward, thread 0 / thread 1 (mean of the rounds)")
        print(f"   forward medians: {va}: {meds.get(va)}, {vb}: {meds.get(vb)}")
        print(f"   {'op':14s} {va + ': comp':>16s} {va + ': wait':>14s}    {vb + ': comp':>16s} {vb + ': wait':>14s}")
        tot = {v: [0.0, 0.0] for v in (va, vb)}
        for op, r in rows.items():
            def f(t):
                return f"{t[0]:6.3f} / {t[2]:6.3f}  {t[1]:5.3f} / {t[3]:5.3f}" if t else "-"
            print(f"   {op:14s} {f(r.get(va))}    {f(r.get(vb))}")
            for v in (va, vb):
                if r.get(v):
                    tot[v][0] += r[v][0] + r[v][1]
                    tot[v][1] += r[v][2] + r[v][3]
        print(f"   {'all (comp+wait)':14s} {va}: {tot[va][0]:.2f} / {tot[va][1]:.2f}    {vb}: {tot[vb][0]:.2f} / {tot[vb][1]:.2f}")
        if op_of_interest:
            per_round = {}
            for v in (va, vb):
                parsed = [parse(f) for f in sorted(glob.glob(f"{folder}/{v}-{model}-n{n}-round*.txt"))]
                per_round[v] = (
                    [(p[1][op_of_interest][0] + p[1][op_of_interest][2]) / 2 for p in parsed],
                    [sum(t[0] + t[1] for t in p[1].values()) for p in parsed],
                    [p[0] for p in parsed])
            for i, what in enumerate((f"{op_of_interest} (ms, threads' mean)", "graph, thread 0 (ms)",
                                      "forward median (ms)")):
                a, b = per_round[va][i], per_round[vb][i]
                print(f"   {what}: {va}: {', '.join(f'{x:.2f}' for x in a)}; {vb}: {', '.join(f'{x:.2f}' for x in b)};"
                      f" {va}/{vb} {paired(a, b)}")
