"""Median of 200 single-token forwards of a model after a 600-token context (random token ids), in ms.

    LLAMA_CPP_LIB_PATH=DIR .venv/bin/python scripts/decode_loop.py [MODEL]

Used for A/B comparisons of two llama.cpp builds (docs/kernels.md): run the builds alternately.
"""

import sys
import time
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
import numpy as np
b = load_backend(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct", n_ctx=2048)
ids = np.random.default_rng(0).integers(100, 20000, size=900).tolist()
b.forward([ForwardRequest(0, ids[:600], logits="none")])
ts = []
for i in range(600, 800):
    t = time.perf_counter(); b.forward([ForwardRequest(0, [ids[i]], logits="last")]); ts.append(time.perf_counter() - t)
print("median ms", 1000 * sorted(ts)[len(ts)//2])
