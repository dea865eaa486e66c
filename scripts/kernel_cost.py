"""T(n) of one llama.cpp build in CPU time, for docs/kernels.md (robust on a shared machine).

Usage: .venv/bin/python scripts/kernel_cost.py MODEL [THREADS] [SIZES] [REPEATS] [CONTEXT]
  e.g. scripts/kernel_cost.py qwen2.5-coder-1.5b-instruct 1 1,2,4,8,16 5 100
Pick the build with LLAMA_CPP_LIB_PATH (a folder holding its libllama.so and libggml*.so);
interleave builds in separate processes (one library per process). Prints one JSON object:
{n: [median wall ms, median CPU ms of this process, min wall ms]} for a forward over n
tokens with logits at every position, after CONTEXT tokens of context.
"""

import json
import sys
import time

import numpy as np

from speculative.backends.base import ForwardRequest
from speculative.backends.llama_cpp import LlamaCppBackend
from speculative.models import resolve


def main() -> None:
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    name = a[0]
    threads = int(a[1]) if len(a) > 1 else 1
    sizes = [int(x) for x in a[2].split(",")] if len(a) > 2 else [1, 2, 4, 8, 16]
    repeats = int(a[3]) if len(a) > 3 else 5
    ctxn = int(a[4]) if len(a) > 4 else 100
    b = LlamaCppBackend(resolve(name).location, n_ctx=2048, n_threads=threads, model_id=name)
    rng = np.random.default_rng(0)
    ctx = rng.integers(100, 30000, size=ctxn).tolist()
    block = rng.integers(100, 30000, size=max(sizes)).tolist()
    b.forward([ForwardRequest(0, ctx, logits="none")])
    b.forward([ForwardRequest(0, block[:2], logits="all")])  # warm-up
    b.truncate(0, ctxn)
    res = {}
    for n in sizes:
        wall, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            b.forward([ForwardRequest(0, block[:n], logits="all")])
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            b.truncate(0, ctxn)
        res[n] = [float(np.median(wall)) * 1e3, float(np.median(cpu)) * 1e3, float(np.min(wall)) * 1e3]
    b.close()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
