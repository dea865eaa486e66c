"""Are two builds' logits bitwise equal? Runs the same forwards (a 17-token prefill, an 8-token batch, three
single tokens, logits at every position) of MODEL with NUMERICS under each library folder and compares the bits.
Usage: .venv/bin/python logits_compare.py LIBS_A LIBS_B MODEL exact|fast"""
import os
import subprocess
import sys
import tempfile

import numpy as np

CHILD = r"""
import sys, numpy as np
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
b = load_backend(sys.argv[1], "llama.cpp", n_ctx=512, numerics=sys.argv[2])
toks = b.encode("def quicksort(xs):\n    # sort a list of integers in place, then return the number of swaps\n")
out = [b.forward([ForwardRequest(0, toks[:-8], logits="all")])[0].logits.copy()]
out.append(b.forward([ForwardRequest(0, toks[-8:], logits="all")])[0].logits.copy())
for t in toks[:3]:
    out.append(b.forward([ForwardRequest(0, [t], logits="all")])[0].logits.copy())
np.save(sys.argv[3], np.concatenate(out))
"""

a, b, model, numerics = sys.argv[1:5]
with tempfile.TemporaryDirectory() as d:
    res = []
    for i, lib in enumerate((a, b)):
        f = os.path.join(d, f"{i}.npy")
        subprocess.run([sys.executable, "-c", CHILD, model, numerics, f], check=True,
                       env={**os.environ, "LLAMA_CPP_LIB_PATH": lib}, stderr=subprocess.DEVNULL)
        res.append(np.load(f))
print(f"{model} {numerics}: {res[0].shape[0]} positions x {res[0].shape[1]} logits, bitwise equal: "
      f"{np.array_equal(res[0].view(np.uint32), res[1].view(np.uint32))}")
