"""Repeat one forward of N tokens after a context, for a profiler to attach to (docs/kernels.md).

Usage: .venv/bin/python scripts/forward_loop.py MODEL N SECONDS [CONTEXT]
Loads MODEL with exact numerics (2 threads by default), runs a CONTEXT-token prefill (default 600),
writes its process id to forward_loop.ready in the current folder (removed at the end), then repeats
a forward of N random tokens (logits at every position, the context rolled back after each) for
SECONDS and prints the median and the fastest forward in ms. Attach e.g. ``perf record -p $(cat forward_loop.ready) -- sleep 20``.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
from speculative.errors import SpeculativeError


def _args() -> tuple[str, int, float, int]:
    if not 4 <= len(sys.argv) <= 5 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    try:
        n, secs = int(sys.argv[2]), float(sys.argv[3])
        ctxlen = int(sys.argv[4]) if len(sys.argv) > 4 else 600
    except ValueError:
        sys.exit("error: N and CONTEXT must be whole numbers and SECONDS a number\n" + __doc__)
    if n < 1 or ctxlen < 1 or not secs > 0:
        sys.exit("error: N and CONTEXT must be >= 1 and SECONDS > 0")
    return sys.argv[1], n, secs, ctxlen


def main() -> None:
    model, n, secs, ctxlen = _args()
    try:
        b = load_backend(model, n_ctx=max(2048, ctxlen + n + 64), numerics="exact")
    except SpeculativeError as e:
        sys.exit(f"error: {e}")
    rng = np.random.default_rng(0)
    b.forward([ForwardRequest(0, rng.integers(100, 30000, size=ctxlen).tolist(), logits="none")])
    block = rng.integers(100, 30000, size=n).tolist()
    ready = Path("forward_loop.ready")
    ready.write_text(str(os.getpid()))
    ts: list[float] = []
    t0 = time.time()
    try:
        while not ts or time.time() - t0 < secs:
            t = time.perf_counter()
            b.forward([ForwardRequest(0, block, logits="all")])
            ts.append(time.perf_counter() - t)
            b.truncate(0, ctxlen)
    finally:
        ready.unlink(missing_ok=True)
        b.close()
    print(f"{model} n={n} context={ctxlen}: median {np.median(ts) * 1e3:.1f} ms, fastest {min(ts) * 1e3:.1f} ms "
          f"over {len(ts)} forwards")


if __name__ == "__main__":
    main()
