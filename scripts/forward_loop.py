"""Repeat one forward of N tokens after a context, for a profiler to attach to (docs/kernels.md).

Usage: .venv/bin/python scripts/forward_loop.py MODEL N SECONDS [CONTEXT]
Loads MODEL with exact numerics (2 threads by default), runs a CONTEXT-token prefill (default 600),
writes its process id to forward_loop.ready in the current folder, then repeats a forward of N random
tokens (logits at every position, the context rolled back after each) for SECONDS and prints the
median and the fastest forward in ms. Attach e.g. ``perf record -p $(cat forward_loop.ready) -- sleep 20``.
"""

import os
import sys
import time

import numpy as np

from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ctxlen = int(sys.argv[4]) if len(sys.argv) > 4 else 600
    b = load_backend(model, n_ctx=2048, numerics="exact")
    rng = np.random.default_rng(0)
    b.forward([ForwardRequest(0, rng.integers(100, 30000, size=ctxlen).tolist(), logits="none")])
    block = rng.integers(100, 30000, size=n).tolist()
    with open("forward_loop.ready", "w") as f:
        f.write(str(os.getpid()))
    ts: list[float] = []
    t0 = time.time()
    while time.time() - t0 < secs:
        t = time.perf_counter()
        b.forward([ForwardRequest(0, block, logits="all")])
        ts.append(time.perf_counter() - t)
        b.truncate(0, ctxlen)
    print(f"{model} n={n} context={ctxlen}: median {np.median(ts) * 1e3:.1f} ms, fastest {min(ts) * 1e3:.1f} ms "
          f"over {len(ts)} forwards")
    b.close()


if __name__ == "__main__":
    main()
