"""In-process A/B of two settings of a test-only build's knob (a function of libggml-cpu that takes one integer and
is called between forwards: ggml_bimm_set_prefetch of prefetch-toggle.diff, ggml_bimm_set_private_rows of
../private-prep-zen4/in-process-toggle.diff).

Usage (repository root): LLAMA_CPP_LIB_PATH=FOLDER .venv/bin/python docs/bench/kernels-v18-zen4/in_process_ab.py \
    MODEL N PAIRS FORWARDS SETTER A B

Prefills 600 tokens, then runs PAIRS pairs of blocks, FORWARDS forwards of N tokens each (the context rolled back
after each; the first two after a switch left out), one block with the setter called with A and one with B, the
order alternating from pair to pair. Prints each block's median and the ratio A/B of the pairs' medians (above 1:
B faster): geometric mean with a 95% t-interval, and the medians of all of A's and all of B's forwards. One
process, so both settings share the weights' pages and the machine's state, which on this machine moves by 10-20%
from minute to minute and from process to process.
"""
import ctypes
import math
import statistics
import sys
import time

import numpy as np
from scipy import stats

from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest

model, n, pairs_n, per, setter_name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
val = {"A": int(sys.argv[6]), "B": int(sys.argv[7])}
b = load_backend(model, n_ctx=2048, numerics="exact")
lib = next(line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if "libggml-cpu" in line)
setter = getattr(ctypes.CDLL(lib), setter_name)
setter.argtypes = [ctypes.c_int]
rng = np.random.default_rng(0)
b.forward([ForwardRequest(0, rng.integers(100, 30000, size=600).tolist(), logits="none")])
block = rng.integers(100, 30000, size=n).tolist()
times = {"A": [], "B": []}
pairs = []
for i in range(pairs_n):
    med = {}
    for which in (("A", "B") if i % 2 == 0 else ("B", "A")):
        setter(val[which])
        ts = []
        for _ in range(per + 2):
            t0 = time.perf_counter()
            b.forward([ForwardRequest(0, block, logits="all")])
            ts.append(time.perf_counter() - t0)
            b.truncate(0, 600)
        med[which] = statistics.median(ts[2:])
        times[which] += ts[2:]
    pairs.append((med["A"], med["B"]))
    print(f"pair {i + 1}: A {med['A'] * 1e3:.2f} ms, B {med['B'] * 1e3:.2f} ms", flush=True)
logs = [math.log(x / y) for x, y in pairs]
g = statistics.mean(logs)
h = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
print(f"{model} n={n} {setter_name} A={val['A']} B={val['B']} lib {lib}: {pairs_n} pairs of blocks of {per} forwards; "
      f"A/B {math.exp(g):.3f}x ({math.exp(g - h):.3f}-{math.exp(g + h):.3f}); all forwards' medians "
      f"A {statistics.median(times['A']) * 1e3:.2f} B {statistics.median(times['B']) * 1e3:.2f} ms")
