"""Build and run tests/native/bench_bimm.c against the installed llama.cpp build.

Prints the integer multiply-add peak of the kernels' inner instruction, the read bandwidth,
and each weight type's kernel rate in cache and streaming from memory (docs/kernels.md).

    .venv/bin/python scripts/bench_kernels.py [--lib DIR] [threads] [K] [MB]

--lib DIR (first) runs against the libraries in DIR (a copy of the venv's llama_cpp/lib, e.g. of an earlier
build) instead of the installed ones; the kernels then come from DIR's libggml-cpu. The headers are the current
patch's (the kernels' API, which the versions so far share).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from speculative.kernels import llama_lib_dir, patched_source_dir

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    lib = None
    if "--lib" in argv:
        if argv[:1] != ["--lib"]:
            print("error: --lib DIR must come first (usage: bench_kernels.py [--lib DIR] [threads] [K] [MB])",
                  file=sys.stderr)
            return 2
        linked = [f"{name}{ext}" for name in ("libggml-cpu", "libggml-base", "libggml") for ext in (".so", ".so.0")]
        if len(argv) < 2 or not all((Path(argv[1]) / name).is_file() for name in linked):
            print("error: --lib needs a folder with libggml-cpu.so, libggml-base.so and libggml.so, each also as .so.0 "
                  "(a copy of the venv's llama_cpp/lib)", file=sys.stderr)
            return 2
        lib, argv = Path(argv[1]).resolve(), argv[2:]
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = patched_source_dir() / "include"
    if cc is None or not (inc / "ggml-cpu-bimm.h").is_file():
        print(f"error: needs a C compiler and the patched ggml headers at {inc} (scripts/setup.sh keeps them)",
              file=sys.stderr)
        return 2
    if lib is None:
        try:
            lib = llama_lib_dir()
        except FileNotFoundError as e:
            print(f"error: {e} (scripts/setup.sh installs it), or give --lib DIR", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bench_bimm"
        subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{inc}",
                        str(ROOT / "tests" / "native" / "bench_bimm.c"), f"-L{lib}", f"-Wl,-rpath,{lib}",
                        "-lggml-cpu", "-lggml-base", "-lggml", "-lpthread", "-o", str(exe)], check=True)
        return subprocess.run([str(exe), *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
