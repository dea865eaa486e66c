"""Are two builds' logits bitwise equal? Runs the same forwards of MODEL with NUMERICS under each library folder
(each in a process of its own, LLAMA_CPP_LIB_PATH set to the folder) and compares the bits.

    .venv/bin/python scripts/logits_compare.py LIBS_A LIBS_B MODEL [exact|fast]

LIBS_A, LIBS_B: folders holding a build's libraries (a copy of the venv's llama_cpp/lib, e.g. made after each
set-up build). The forwards: a prefill of a code prompt less its last 8 tokens, those 8 tokens as one batch, then
3 single tokens, with logits at every position (25 rows for the Qwen tokenizer). Prints the rows compared, which
libggml-cpu each process mapped (path and sha256 prefix, so a folder that was not used shows), and whether the
logits are bitwise equal (with the largest difference when they are not). A process that mapped a libggml-cpu
from outside its folder (LLAMA_CPP_LIB_PATH not honoured) is an error, and two folders holding the same library
are said to be so. Exit status 0 when equal, 1 when not, 2 for bad arguments or a failed run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPT = "def quicksort(xs):\n    # sort a list of integers in place, then return the number of swaps\n"

CHILD = r"""
import hashlib, sys
import numpy as np
from speculative.backends import load_backend
from speculative.backends.base import ForwardRequest
b = load_backend(sys.argv[1], "llama.cpp", n_ctx=512, numerics=sys.argv[2])
toks = b.encode(sys.argv[4])
out = [b.forward([ForwardRequest(0, toks[:-8], logits="all")])[0].logits.copy()]
out.append(b.forward([ForwardRequest(0, toks[-8:], logits="all")])[0].logits.copy())
for t in toks[:3]:
    out.append(b.forward([ForwardRequest(0, [t], logits="all")])[0].logits.copy())
np.save(sys.argv[3], np.concatenate(out))
for lib in sorted({line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if "libggml-cpu" in line}):
    path = lib.removesuffix(" (deleted)")
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16] if path == lib else "(file deleted)"
    print(f"mapped {path} sha256 {sha}")
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs_a", type=Path)
    ap.add_argument("libs_b", type=Path)
    ap.add_argument("model")
    ap.add_argument("numerics", nargs="?", default="exact", choices=("exact", "fast"))
    args = ap.parse_args(argv)
    for d in (args.libs_a, args.libs_b):
        if not (d / "libggml-cpu.so").is_file():
            print(f"error: {d} holds no libggml-cpu.so (give a copy of the venv's llama_cpp/lib)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        res, shas = [], []
        for i, lib in enumerate((args.libs_a, args.libs_b)):
            f = os.path.join(tmp, f"{i}.npy")
            try:
                run = subprocess.run([sys.executable, "-c", CHILD, args.model, args.numerics, f, PROMPT],
                                     env={**os.environ, "LLAMA_CPP_LIB_PATH": str(lib.resolve())},
                                     capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired:
                print(f"error: the forwards under {lib} took more than 900 s", file=sys.stderr)
                return 2
            if run.returncode != 0:
                tail = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(f"error: the forwards under {lib} failed: {tail}", file=sys.stderr)
                return 2
            mapped = [line[len("mapped "):].rsplit(" sha256 ", 1)[0] for line in run.stdout.splitlines()
                      if line.startswith("mapped ")]
            outside = [m for m in mapped if Path(m).resolve().parent != lib.resolve()]
            if not mapped or outside:
                print(f"error: the process for {lib} mapped {', '.join(mapped) or 'no libggml-cpu'}, not its folder's "
                      "library (is LLAMA_CPP_LIB_PATH honoured by this llama-cpp-python?)", file=sys.stderr)
                return 2
            print(f"{'AB'[i]}: {run.stdout.strip()}")
            shas.append({line.rsplit(" sha256 ", 1)[1] for line in run.stdout.splitlines() if line.startswith("mapped ")})
            res.append(np.load(f))
    if shas[0] == shas[1] and "(file deleted)" not in shas[0]:
        print("note: both folders hold the same libggml-cpu (same sha256): the comparison cannot tell builds apart")
    a, b = res
    if a.shape != b.shape:
        print(f"{args.model} {args.numerics}: shapes differ, A {a.shape} against B {b.shape}: not equal")
        return 1
    equal = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    print(f"{args.model} {args.numerics}: {a.shape[0]} positions x {a.shape[1]} logits, bitwise equal: {equal}"
          + ("" if equal else f" (largest difference {float(np.abs(a - b).max()):.3g})"))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
