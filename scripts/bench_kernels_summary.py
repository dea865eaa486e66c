"""Summarize alternating runs of scripts/bench_kernels.py against two or more builds (one file, each run
headed "== build NAME, round R, T threads"): per build, thread count, weight type and token count, the
median over rounds of the streaming rate (GB/s of weights read from memory) and of the in-cache rate
(GMAC/s), and for each build after the first the ratio of its median to the first build's; with two or
more rounds, also the ratios paired per round (build / first build in the same round): their geometric
mean and 95% t-interval, the bench's own (speculative.bench.report.geometric_mean_ci).

    .venv/bin/python scripts/bench_kernels_summary.py docs/bench/kernels-v10-xeon/bench-kernels-ab.txt
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from speculative.bench.report import geometric_mean_ci  # noqa: E402


def parse(text: str) -> dict:
    """{(build, threads, type, "stream" | "cache", n): {round: rate}}; stream rates in GB/s, cache in GMAC/s.

    Raises:
        ValueError: a line starting with "==" that is not a run header, a run whose own thread count
            ("kernels ISA, N threads") differs from its header's, or a build with the same round twice.
    """
    runs: dict = defaultdict(dict)
    build = threads = rnd = None
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("=="):
            head = re.fullmatch(r"== build (\S+), round (\d+), (\d+) threads?\s*", line)
            if head is None:
                raise ValueError(f"line {no}: not a run header ('== build NAME, round R, T threads'): {line[:80]!r}")
            build, rnd, threads = head.group(1), int(head.group(2)), int(head.group(3))
            continue
        own = re.match(r"kernels \S+, (\d+) threads?", line)
        if own and build is not None and int(own.group(1)) != threads:
            raise ValueError(f"line {no}: the run says {own.group(1)} threads, its header {threads}")
        m = re.match(r"(\w+)\s+(stream|compute)", line)
        if m is None or build is None:
            continue
        kind = "stream" if m.group(2) == "stream" else "cache"
        num = r"\d+(?:\.\d+)?"
        pat = rf"n=(\d+) {num} GMAC/s ({num}) GB/s" if kind == "stream" else rf"n=(\d+) ({num}) GMAC/s"
        for n, rate in re.findall(pat, line):
            key = (build, threads, m.group(1), kind, int(n))
            if rnd in runs[key]:
                raise ValueError(f"line {no}: build {build} has round {rnd} twice ({kind} {m.group(1)} n={n}); "
                                 "give each run of a build its own round number")
            runs[key][rnd] = float(rate)
    return runs


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: bench_kernels_summary.py FILE  (alternating bench_kernels.py runs, each headed "
              "'== build NAME, round R, T threads')", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        runs = parse(path.read_text(errors="replace"))
    except OSError as e:
        print(f"error: cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no bench_kernels runs headed '== build NAME, round R, T threads' in {path}", file=sys.stderr)
        return 2
    builds = list(dict.fromkeys(k[0] for k in runs))
    if len(builds) < 2:
        print(f"error: expected two or more builds, found {builds}", file=sys.stderr)
        return 2
    a = builds[0]
    for b in builds[1:]:
        print(f"median over rounds; ratio {b}/{a} (above 1: {b} faster); paired: the rounds' own ratios, "
              "geometric mean (95% interval)")
        for kind, unit in (("stream", "GB/s"), ("cache", "GMAC/s")):
            keys = sorted({k[1:] for k in runs if k[3] == kind}, key=lambda k: (-k[0], k[1], k[3]))
            for threads, typ, _, n in keys:
                ra, rb = runs.get((a, threads, typ, kind, n)), runs.get((b, threads, typ, kind, n))
                if not ra or not rb:
                    continue
                ma, mb = statistics.median(ra.values()), statistics.median(rb.values())
                ratio = f"{mb / ma:.2f}" if ma > 0 else "n/a"
                line = (f"{kind:6s} {threads} thr {typ:5s} n={n:<2d} {a} {ma:6.1f} {b} {mb:6.1f} {unit:6s} "
                        f"ratio {ratio} (rounds {len(ra)}/{len(rb)})")
                both = sorted(r for r in set(ra) & set(rb) if ra[r] > 0 and rb[r] > 0)
                if len(both) >= 2:
                    g, lo, hi = geometric_mean_ci([rb[r] / ra[r] for r in both])
                    line += f" paired {g:.3f} ({lo:.3f}-{hi:.3f})"
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
