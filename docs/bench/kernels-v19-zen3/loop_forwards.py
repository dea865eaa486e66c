"""Runs forwards of N tokens after a 600-token context for SECONDS seconds (the context rolled back after each),
for perf. Usage: .venv/bin/python loop_forwards.py MODEL N SECONDS"""
import sys, time
import numpy as np
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
model, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
b = load_backend(model, n_ctx=2048, numerics="exact")
rng = np.random.default_rng(0)
b.forward([ForwardRequest(0, rng.integers(100, 30000, size=600).tolist(), logits="none")])
block = rng.integers(100, 30000, size=n).tolist()
t_end = time.time() + secs; k = 0; ts=[]
while time.time() < t_end:
    t0=time.perf_counter(); b.forward([ForwardRequest(0, block, logits="all")]); ts.append(time.perf_counter()-t0); b.truncate(0, 600); k += 1
ts.sort(); print(k, "forwards, median ms", ts[len(ts)//2]*1e3)
