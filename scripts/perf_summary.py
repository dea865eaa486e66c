"""Summarize `perf report` text files of a forward loop (docs/kernels.md, "Where the time goes").

Usage: .venv/bin/python scripts/perf_summary.py FOLDER
Reads FOLDER/perf-NAME.txt (perf report --sort dso,symbol) and FOLDER/perf-NAME-dso.txt (--sort dso)
for each NAME and prints the share of samples in attention's F16 dot products
(ggml_bimm_f16_dot, the exact contexts' order since the patch's seventh version; ggml_vec_dot_f16_cols
before it and in fast numerics), in OpenMP's barrier waits (libgomp), in the named functions of
libggml-cpu listed at 0.5% or more, and in the rest of libggml-cpu (the stripped library's unnamed
static functions: the CPU_BIMM tile kernels above all, and named functions under 0.5%).
"""

import re
import sys
from pathlib import Path


#: the functions that compute attention's products with the F16 K/V caches
ATTENTION = ("ggml_bimm_f16_dot", "ggml_vec_dot_f16_cols")


def shares(sym: Path, dso: Path) -> dict[str, float]:
    by_dso = {m[2]: float(m[1]) for m in re.finditer(r"^\s*([\d.]+)%\s+(\S+)\s*$", dso.read_text(), re.M)}
    attention = named = 0.0
    for m in re.finditer(r"^\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(\S+)", sym.read_text(), re.M):
        pct, lib, name = float(m[1]), m[2], m[3]
        if "ggml-cpu" not in lib or name.startswith("0x"):
            continue
        if name in ATTENTION:
            attention += pct
        else:
            named += pct
    cpu = sum(v for k, v in by_dso.items() if "ggml-cpu" in k)
    gomp = sum(v for k, v in by_dso.items() if "gomp" in k)
    return {"attention (F16 K/V dot products)": attention, "OpenMP barrier waits": gomp,
            "other named ggml-cpu functions >= 0.5%": named,
            "rest of libggml-cpu (tile kernels, small functions)": cpu - attention - named,
            "outside ggml-cpu and OpenMP": 100.0 - cpu - gomp}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    folder = Path(sys.argv[1])
    if not folder.is_dir():
        sys.exit(f"error: {folder} is not a folder")
    files = [p for p in sorted(folder.glob("perf-*.txt")) if not p.stem.endswith("-dso")]
    if not files:
        sys.exit(f"error: no perf-NAME.txt files in {folder} (perf report --sort dso,symbol > perf-NAME.txt)")
    for sym in files:
        dso = sym.with_name(sym.stem + "-dso.txt")
        if not dso.is_file():
            sys.exit(f"error: {dso} is missing (perf report --sort dso > {dso.name})")
        s = shares(sym, dso)
        if s["outside ggml-cpu and OpenMP"] >= 100.0:
            print(f"warning: {sym.name}: no libggml-cpu or OpenMP samples found; is it a perf report of a forward loop?",
                  file=sys.stderr)
        print(f"{sym.stem[5:]}: " + "; ".join(f"{k} {v:.1f}%" for k, v in s.items()))


if __name__ == "__main__":
    main()
