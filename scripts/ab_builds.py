"""A/B two builds of llama.cpp's libraries with alternating `speculative profile` runs, ratios paired per round.

    .venv/bin/python scripts/ab_builds.py --a OLD_LIB_DIR --b NEW_LIB_DIR --target qwen2.5-coder-1.5b-instruct \
        --sizes 1,8 --rounds 6 --out docs/bench/NAME

Each round installs build A's libraries (libllama.so, libggml*.so, copied from --a) into the venv's
llama_cpp/lib and runs `speculative profile` (2 rounds x --repeats forwards per size, default 5, its own
median), then build B's, and so on; the libraries that were installed before are put back at the end (also after an error or
Ctrl-C). Writes A-<i>.json and B-<i>.json (every timing) and summary.txt: per size, each round's T(n) for
A and B and the ratio A/B (above 1: B is faster), their geometric mean and a 95% t-interval over the
rounds. Same machine, same hour, one process at a time.
"""

from __future__ import annotations

import argparse
import json
import math
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
    """Put every library of src (symlinks followed) in place of dst's file of the same name, and of dst's
    versioned names of it that src lacks (libllama.so loads libggml.so.0 by its soname, so a folder of
    unversioned names must replace the versioned files too): a new file renamed over the old one, so that a
    process that has the old library mapped keeps it intact."""
    for f in src.iterdir():
        if not f.is_file():
            continue
        names = [f.name] + sorted(d.name for d in dst.iterdir()
                                  if d.name.startswith(f.name + ".") and not (src / d.name).exists())
        for name in names:
            tmp = dst / f".{name}.ab-tmp"
            shutil.copy2(f, tmp, follow_symlinks=True)
            tmp.replace(dst / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, help="folder with build A's libraries (the baseline)")
    ap.add_argument("--b", type=Path, help="folder with build B's libraries")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--sizes", default="1,8", help="forward sizes (default 1,8)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="alternations A, B (default 6; with --summary-only: every round in --out)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="forwards per size in each of a profile run's 2 rounds (default 5; more resolve smaller "
                         "differences on a noisy machine; with --summary-only the run files say)")
    ap.add_argument("--out", required=True, type=Path, help="folder for the run files (created)")
    ap.add_argument("--summary-only", action="store_true",
                    help="no runs: recompute summary.txt from the run files already in --out")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out}: exists and is not a folder")
    if args.summary_only:
        if not args.out.is_dir():
            ap.error(f"--out {args.out}: no such folder (--summary-only reads the run files in it)")
        found = 0
        while all((args.out / f"{v}-{found + 1}.json").is_file() for v in "AB"):
            found += 1
        if args.rounds is None:
            if found < 2:
                ap.error(f"{args.out}: holds {found} paired rounds (A-1.json, B-1.json, ...); a summary needs 2")
            args.rounds = found
        elif args.rounds != found and found >= 2:
            ap.error(f"{args.out}: holds {found} paired rounds, not {args.rounds} (leave --rounds out to use them all)")
    elif args.rounds is None:
        args.rounds = 6
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
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
        try:
            run_rounds(args)
        except (subprocess.CalledProcessError, OSError) as e:
            what = f"exit code {e.returncode}" if isinstance(e, subprocess.CalledProcessError) else str(e)
            kept = f"; run files so far in {args.out}" if args.out.is_dir() else ""
            raise SystemExit(f"error: speculative profile failed ({what}); the libraries installed before were "
                             f"put back{kept}") from None
    try:
        return summarize(args, sizes)
    except RunFileError as e:
        raise SystemExit(f"error: {e}") from None


def run_rounds(args) -> None:
    made = [d for d in [args.out, *args.out.parents] if not d.exists()]  # the folders this run creates
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        _run_rounds(args)
    finally:
        for d in made:  # innermost first: nothing was written, so leave no empty folders behind
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()


def _run_rounds(args) -> None:
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
                                    "--rounds", "2", "--repeats", str(args.repeats), "-o", str(out)],
                                   check=True, stdout=subprocess.DEVNULL)
        finally:
            install(saved, dst)


class RunFileError(Exception):
    """A run file that cannot be read, is not a profile's JSON, or lacks a size's time."""


def t_ms(path: Path, n: int) -> float:
    """T(n) in ms from one profile run file. Raises RunFileError naming the file."""
    try:
        t = json.loads(path.read_text())["t_ms"][str(n)]
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise RunFileError(f"{path}: not a profile JSON file ({e})") from None
    except (KeyError, TypeError):
        raise RunFileError(f"{path}: holds no T({n}) (run with --sizes including {n}?)") from None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and math.isfinite(t)):
        raise RunFileError(f"{path}: T({n}) = {t!r} is not a positive, finite time")
    return float(t)


def repeats_of(path: Path) -> int | None:
    """Forwards per size and round in one profile run file (its raw timings), or None where they cannot be read."""
    try:
        return len(json.loads(path.read_text())["raw_ms"][0][0])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


def summarize(args, sizes: list[int]) -> int:
    reps = repeats_of(args.out / "A-1.json") if args.summary_only else args.repeats
    lines = [f"A: {args.a or '(see command.txt)'}", f"B: {args.b or '(see command.txt)'}", f"target {args.target}; {args.rounds} alternating rounds; "
             f"T(n) per run: the profile's median over 2 rounds of {reps or '?'} forwards; "
             "ratio A/B (above 1: B faster), "
             "geometric mean over rounds, 95% t-interval", ""]
    for n in sizes:
        ta = [t_ms(args.out / f"A-{i}.json", n) for i in range(1, args.rounds + 1)]
        tb = [t_ms(args.out / f"B-{i}.json", n) for i in range(1, args.rounds + 1)]
        g, lo, hi = geometric_mean_ci([a / b for a, b in zip(ta, tb)])
        lines.append(f"T({n}) ms  A: {' / '.join(f'{x:.1f}' for x in ta)}")
        lines.append(f"T({n}) ms  B: {' / '.join(f'{x:.1f}' for x in tb)}")
        lines.append(f"T({n}) A/B: {g:.3f}x ({lo:.3f}-{hi:.3f})")
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
