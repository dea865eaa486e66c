"""Paired ratios A/B of pairs.sh output (above 1: B faster): median and fastest forward per round, geometric mean
over the rounds with a 95% t-interval on the log scale. Usage: python3 pairs_summary.py FILE..."""
import math
import re
import statistics
import sys

from scipy import stats

for path in sys.argv[1:]:
    rows, cur = {"A": [], "B": []}, None
    for line in open(path):
        m = re.match(r"== round (\d+) build (\w)", line)
        if m:
            cur = m.group(2)
            continue
        m = re.search(r"median ([\d.]+) ms, fastest ([\d.]+) ms over (\d+)", line)
        if m and cur:
            rows[cur].append((float(m.group(1)), float(m.group(2))))
    n = min(len(rows["A"]), len(rows["B"]))
    print(f"{path}: {n} rounds")
    for i, what in enumerate(("median", "fastest")):
        a = [r[i] for r in rows["A"][:n]]
        b = [r[i] for r in rows["B"][:n]]
        logs = [math.log(x / y) for x, y in zip(a, b)]
        g = statistics.mean(logs)
        h = stats.t.ppf(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
        print(f"  {what:8s} A: {' '.join(f'{x:.2f}' for x in a)}")
        print(f"  {what:8s} B: {' '.join(f'{x:.2f}' for x in b)}")
        print(f"  {what:8s} A/B {math.exp(g):.3f}x ({math.exp(g - h):.3f}-{math.exp(g + h):.3f}); "
              f"medians over rounds A {statistics.median(a):.2f} B {statistics.median(b):.2f} ms")
