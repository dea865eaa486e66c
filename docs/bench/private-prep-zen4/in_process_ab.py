"""In-process A/B of the shared and the private activation preparation (a test-only build: in-process-toggle.diff
on top of the patch, whose ggml_bimm_set_private_rows switches between them between forwards).

Usage (repository root): LLAMA_CPP_LIB_PATH=FOLDER .venv/bin/python docs/bench/private-prep-zen4/in_process_ab.py \
    MODEL N BLOCKS FORWARDS

Prefills 600 tokens, then alternates BLOCKS times between setting A (0: one thread prepares, then a barrier) and
setting B (2: each thread prepares rows itself when there are at most 2), FORWARDS forwards of N tokens per block
(the context rolled back after each), the order within each pair of blocks alternating. Prints each block's median
and the ratio A/B of the pairs' medians (above 1: B faster): geometric mean with a 95% t-interval, and the medians of
all of A's and all of B's forwards. One process, so both settings share the weights' pages and the machine's state.
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

model, n, blocks, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
b = load_backend(model, n_ctx=2048, numerics="exact")
lib = next(line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if "libggml-cpu" in line)
setter = ctypes.CDLL(lib).ggml_bimm_set_private_rows
setter.argtypes = [ctypes.c_size_t]
rng = np.random.default_rng(0)
b.forward([ForwardRequest(0, rng.integers(100, 30000, size=600).tolist(), logits="none")])
block = rng.integers(100, 30000, size=n).tolist()
times = {"A": [], "B": []}
pairs = []
for i in range(blocks):
    med = {}
    for which in (("A", "B") if i % 2 == 0 else ("B", "A")):
        setter(0 if which == "A" else 2)
        ts = []
        for _ in range(per + 2):
            t0 = time.perf_counter()
            b.forward([ForwardRequest(0, block, logits="all")])
            ts.append(time.perf_counter() - t0)
            b.truncate(0, 600)
        ts = ts[2:]  # the first two after a switch left out
        med[which] = statistics.median(ts)
        times[which] += ts
    pairs.append((med["A"], med["B"]))
    print(f"block {i + 1}: A {med['A'] * 1e3:.2f} ms, B {med['B'] * 1e3:.2f} ms", flush=True)
logs = [math.log(a / bb) for a, bb in pairs]
g = statistics.mean(logs)
h = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
print(f"{model} n={n} lib {lib}: {blocks} pairs of blocks of {per} forwards; A/B {math.exp(g):.3f}x "
      f"({math.exp(g - h):.3f}-{math.exp(g + h):.3f}); all forwards' medians A {statistics.median(times['A']) * 1e3:.2f} "
      f"B {statistics.median(times['B']) * 1e3:.2f} ms")
