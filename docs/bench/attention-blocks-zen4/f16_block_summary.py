"""Per shape, the median over the rounds of f16-block-bench.txt's times per call and rates, and the sixteenth's
time over the new one's (the median's ratio, and the range of the per-round ratios).

Usage: python3 f16_block_summary.py f16-block-bench.txt
"""
import collections
import re
import statistics
import sys

runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    if line.startswith("peak"):
        print(line.strip())
    m = re.match(r"round \d+ (\w+) (n=\d+ rows=\d+ columns=\d+): ([\d.]+) us per call, ([\d.]+) G", line)
    if m:
        runs[m.group(2)][m.group(1)].append((float(m.group(3)), float(m.group(4))))
for shape, v in runs.items():
    a, b = [x[0] for x in v["v16"]], [x[0] for x in v["new"]]
    ga, gb = statistics.median(x[1] for x in v["v16"]), statistics.median(x[1] for x in v["new"])
    ratios = [x / y for x, y in zip(a, b)]
    print(f"{shape:30s} v16 {statistics.median(a):6.2f} us ({ga:.2f} G/s)  new {statistics.median(b):6.2f} us "
          f"({gb:.2f} G/s)  v16/new {statistics.median(a) / statistics.median(b):.2f} "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)")
