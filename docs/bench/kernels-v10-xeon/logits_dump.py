"""Dump the exact-numerics logits of Qwen2.5-Coder-1.5B for a 14-token batch, an 8-token batch and 3 single
tokens (25 rows), and say which libggml-cpu the process mapped (path and sha256); or compare two dumps.

    LLAMA_CPP_LIB_PATH=/tmp/libs-old .venv/bin/python docs/bench/kernels-v10-xeon/logits_dump.py /tmp/old.npy
    LLAMA_CPP_LIB_PATH=/tmp/libs-new .venv/bin/python docs/bench/kernels-v10-xeon/logits_dump.py /tmp/new.npy
    .venv/bin/python docs/bench/kernels-v10-xeon/logits_dump.py --compare /tmp/old.npy /tmp/new.npy
"""

import hashlib
import sys

import numpy as np


def dump(path: str) -> None:
    from speculative.backends import load_backend
    from speculative.backends.base import ForwardRequest

    b = load_backend("qwen2.5-coder-1.5b-instruct", "llama.cpp", n_ctx=512)
    toks = b.encode("def quicksort(xs):\n    # sort a list of integers in place, then return the number of swaps\n")
    out = [b.forward([ForwardRequest(0, toks[:-8], logits="all")])[0].logits.copy()]
    out.append(b.forward([ForwardRequest(0, toks[-8:], logits="all")])[0].logits.copy())
    for t in toks[:3]:
        out.append(b.forward([ForwardRequest(0, [t], logits="all")])[0].logits.copy())
    np.save(path, np.concatenate(out))
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libggml-cpu" in line})
    for lib in libs:
        print(f"mapped {lib} sha256 {hashlib.sha256(open(lib, 'rb').read()).hexdigest()[:16]}")
    print(f"rows: {len(toks) - 8}-token batch, 8-token batch, 3 single tokens = {sum(len(o) for o in out)}")


def compare(a_path: str, b_path: str) -> None:
    a, b = np.load(a_path), np.load(b_path)
    print(f"{a_path} against {b_path}: {a.shape[0]} rows x {a.shape[1]} logits")
    print(f"bitwise equal: {a.shape == b.shape and a.tobytes() == b.tobytes()}; max abs difference: "
          f"{float(np.abs(a - b).max()) if a.shape == b.shape else 'shapes differ'}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"] and len(sys.argv) == 4:
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2 and not sys.argv[1].startswith("-"):
        dump(sys.argv[1])
    else:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        sys.exit(2)
