"""A/B two builds of llama.cpp's libraries with alternating `speculative profile` runs, ratios paired per round.

    .venv/bin/python scripts/ab_builds.py --a OLD_LIB_DIR --b NEW_LIB_DIR --target qwen2.5-coder-1.5b-instruct \
        --sizes 1,8 --rounds 6 --out docs/bench/NAME

Each round installs build A's libraries (libllama.so, libggml*.so, copied from --a) into the venv's
llama_cpp/lib and runs `speculative profile` (2 rounds x 5 forwards per size, its own median), then build
B's, and so on; the libraries that were installed before are put back at the end (also after an error or
Ctrl-C). Writes A-<i>.json and B-<i>.json (every timing) and summary.txt: per size, each round's T(n) for
A and B and the ratio A/B (above 1: B is faster), their geometric mean and a 95% t-interval over the
rounds. Same machine, same hour, one process at a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from speculative.bench.report import geometric_mean_ci  # noqa: E402  (the bench's own interval)

LIBS = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")


def lib_dir() -> Path:
    """The venv's llama_cpp/lib, found without importing llama_cpp (this process must not map the
    libraries it replaces)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise SystemExit("error: llama-cpp-python is not installed in this environment (scripts/setup.sh)")
    return Path(spec.origin).parent / "lib"


def install(src: Path, dst: Path) -> None:
    """Put every file of src (symlinks followed) in place of dst's file of the same name: a new file renamed
    over the old one, so that a process that has the old library mapped keeps it intact."""
    for f in src.iterdir():
        if f.is_file():
            tmp = dst / f".{f.name}.ab-tmp"
            shutil.copy2(f, tmp, follow_symlinks=True)
            tmp.replace(dst / f.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, help="folder with build A's libraries (the baseline)")
    ap.add_argument("--b", type=Path, help="folder with build B's libraries")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--sizes", default="1,8", help="forward sizes (default 1,8)")
    ap.add_argument("--rounds", type=int, default=6, help="alternations A, B (default 6)")
    ap.add_argument("--out", required=True, type=Path, help="folder for the run files (created)")
    ap.add_argument("--summary-only", action="store_true",
                    help="no runs: recompute summary.txt from the run files already in --out")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (a confidence interval needs two paired rounds)")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: give whole numbers separated by commas, e.g. 1,8")
    if args.summary_only:
        missing = [f"{v}-{i}.json" for i in range(1, args.rounds + 1) for v in "AB"
                   if not (args.out / f"{v}-{i}.json").is_file()]
        if missing:
            ap.error(f"{args.out}: no run file {missing[0]} (--rounds says {args.rounds})")
    else:
        if args.a is None or args.b is None:
            ap.error("--a and --b are required (unless --summary-only)")
        for side in (args.a, args.b):
            missing = [n for n in LIBS if not (side / n).exists()]
            if missing:
                ap.error(f"{side}: not a llama.cpp library folder (missing {', '.join(missing)})")
        run_rounds(args)
    return summarize(args, sizes)


def run_rounds(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    dst = lib_dir()
    exe = Path(sys.executable).parent / "speculative"
    with tempfile.TemporaryDirectory() as keep:
        saved = Path(keep)
        install(dst, saved)
        try:
            for i in range(1, args.rounds + 1):
                for name, src in (("A", args.a), ("B", args.b)):
                    install(src, dst)
                    out = args.out / f"{name}-{i}.json"
                    print(f"round {i}/{args.rounds}: build {name}", flush=True)
                    subprocess.run([str(exe), "profile", "--target", args.target, "--sizes", args.sizes,
                                    "--rounds", "2", "--repeats", "5", "-o", str(out)],
                                   check=True, stdout=subprocess.DEVNULL)
        finally:
            install(saved, dst)


def summarize(args, sizes: list[int]) -> int:
    lines = [f"A: {args.a or '(see command.txt)'}", f"B: {args.b or '(see command.txt)'}", f"target {args.target}; {args.rounds} alternating rounds; "
             "T(n) per run: the profile's median over 2 rounds of 5 forwards; ratio A/B (above 1: B faster), "
             "geometric mean over rounds, 95% t-interval", ""]
    for n in sizes:
        ta = [json.loads((args.out / f"A-{i}.json").read_text())["t_ms"][str(n)] for i in range(1, args.rounds + 1)]
        tb = [json.loads((args.out / f"B-{i}.json").read_text())["t_ms"][str(n)] for i in range(1, args.rounds + 1)]
        g, lo, hi = geometric_mean_ci([a / b for a, b in zip(ta, tb)])
        lines.append(f"T({n}) ms  A: {' / '.join(f'{x:.1f}' for x in ta)}")
        lines.append(f"T({n}) ms  B: {' / '.join(f'{x:.1f}' for x in tb)}")
        lines.append(f"T({n}) A/B: {g:.3f}x ({lo:.3f}-{hi:.3f})")
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
