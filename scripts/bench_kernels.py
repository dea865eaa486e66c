"""Build and run tests/native/bench_bimm.c against the installed llama.cpp build.

Prints the integer multiply-add peak of the kernels' inner instruction, the read bandwidth,
and each weight type's kernel rate in cache and streaming from memory (docs/kernels.md).

    .venv/bin/python scripts/bench_kernels.py [--lib DIR] [threads] [K] [MB]

--lib DIR runs against the libraries in DIR (a copy of the venv's llama_cpp/lib, e.g. of an earlier build)
instead of the installed ones; the kernels then come from DIR's libggml-cpu.
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
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = patched_source_dir() / "include"
    if cc is None or not (inc / "ggml-cpu-bimm.h").is_file():
        print(f"error: needs a C compiler and the patched ggml headers at {inc} (scripts/setup.sh keeps them)",
              file=sys.stderr)
        return 2
    lib = llama_lib_dir()
    if argv[:1] == ["--lib"]:
        if len(argv) < 2 or not (Path(argv[1]) / "libggml-cpu.so").is_file():
            print("error: --lib needs a folder with libggml-cpu.so (a copy of the venv's llama_cpp/lib)", file=sys.stderr)
            return 2
        lib, argv = Path(argv[1]).resolve(), argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bench_bimm"
        subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{inc}",
                        str(ROOT / "tests" / "native" / "bench_bimm.c"), f"-L{lib}", f"-Wl,-rpath,{lib}",
                        "-lggml-cpu", "-lggml-base", "-lggml", "-lpthread", "-o", str(exe)], check=True)
        return subprocess.run([str(exe), *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
