"""Per-op compute and barrier-wait times of single-token forwards, per thread (a test-only build: per-op-timing.diff).

Usage (from the repository root): NOPS=103 BARRIER_STATS=1 LLAMA_CPP_LIB_PATH=FOLDER \
    .venv/bin/python docs/bench/single-token-ops-xeon/per-op-loop.py MODEL N REPEATS

FOLDER holds a build made with per-op-timing.diff applied (its libggml-cpu sums, per op and thread, the time in the
op and the time waiting at the barrier after it, and prints them at exit). The script prefills 600 tokens, runs 3
warm-up forwards of N tokens, zeroes the counters (NOPS: GGML_OP_COUNT + 2, the rows of each counter array), then
times REPEATS forwards of N tokens (the context rolled back after each); the printed totals are over those forwards.
"""

import ctypes
import os
import sys
import time

import numpy as np

from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest

model, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = load_backend(model, n_ctx=2048, numerics="exact")
rng = np.random.default_rng(0)
b.forward([ForwardRequest(0, rng.integers(100, 30000, size=600).tolist(), logits="none")])
block = rng.integers(100, 30000, size=n).tolist()
for _ in range(3):
    b.forward([ForwardRequest(0, block, logits="all")])
    b.truncate(0, 600)
# the copy that libllama loaded (by its soname), not another file of the same folder
lib = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml-cpu.so.0"))
nops = int(os.environ["NOPS"])
for name in ("g_bst_wait", "g_bst_comp", "g_bst_n"):
    ctypes.memset(ctypes.addressof(ctypes.c_uint64.in_dll(lib, name)), 0, 8 * 4 * nops)
for name in ("g_bimm_prep_wait", "g_bimm_prep_n"):
    ctypes.memset(ctypes.addressof(ctypes.c_uint64.in_dll(lib, name)), 0, 8 * 4)
ts = []
for _ in range(reps):
    t = time.perf_counter()
    b.forward([ForwardRequest(0, block, logits="all")])
    ts.append(time.perf_counter() - t)
    b.truncate(0, 600)
print(f"{model} n={n}: median {np.median(ts) * 1e3:.2f} ms mean {np.mean(ts) * 1e3:.2f} over {reps}", file=sys.stderr)
b.close()
