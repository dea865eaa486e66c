"""The measurement scripts of docs/kernels.md refuse bad arguments with one line, before any long work."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.quick


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", [
    ([], "usage:"),
    (["--help"], "usage:"),
    (["smollm2-135m-instruct", "abc"], "ROUNDS must be a positive whole number"),
    (["smollm2-135m-instruct", "0"], "ROUNDS must be a positive whole number"),
    (["smollm2-135m-instruct", "1", "/no/such/folder/out.jsonl"], "its folder does not exist"),
    (["no-such-model", "1"], "error: unknown model 'no-such-model'"),
    (["x'); print('injected", "1"], "error: unknown model"),  # the name is data, never code
])
def test_decode_vs_llama_bench_usage_errors(args, fragment):
    r = _run("bash", "scripts/decode_vs_llama_bench.sh", *args)
    assert r.returncode != 0
    assert fragment in r.stderr and "Traceback" not in r.stderr and "injected\n" not in r.stdout, r.stderr


@pytest.mark.parametrize("args, fragment", [
    (["smollm2-135m-instruct", "abc", "1"], "must be whole numbers"),
    (["smollm2-135m-instruct", "4", "0"], "SECONDS > 0"),
    (["smollm2-135m-instruct", "0", "1"], "must be >= 1"),
    (["no-such-model", "4", "1"], "error: unknown model 'no-such-model'"),
])
def test_forward_loop_usage_errors(tmp_path, args, fragment):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "forward_loop.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "forward_loop.ready").exists()


def test_perf_summary_errors_and_the_committed_files(tmp_path):
    script = str(ROOT / "scripts" / "perf_summary.py")
    r = _run(sys.executable, script, str(tmp_path / "missing"))
    assert r.returncode != 0 and "is not a folder" in r.stderr
    r = _run(sys.executable, script, str(tmp_path))
    assert r.returncode != 0 and "no perf-NAME.txt files" in r.stderr
    (tmp_path / "perf-x.txt").write_text("junk\n")
    r = _run(sys.executable, script, str(tmp_path))
    assert r.returncode != 0 and "perf-x-dso.txt is missing" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, "docs/bench/kernels-v6-perf-zen4")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("qwen2.5-coder-1.5b-instruct-n8:"))
    assert "attention (F16 K/V dot products) 26.8%" in line  # the share docs/kernels.md quotes


@pytest.mark.parametrize("args, fragment", [
    ([], "--out"),
    (["--out", "x"], "--a and --b are required"),
    (["--out", "x", "--summary-only"], "no run file A-1.json"),
    (["--a", "/no/such", "--b", "/no/such", "--out", "x"], "/no/such: not a llama.cpp library folder"),
    (["--a", "LIB", "--b", "LIB", "--out", "x", "--rounds", "1"], "--rounds must be at least 2"),
])
def test_ab_builds_usage_errors(tmp_path, args, fragment):
    from speculative.kernels import llama_lib_dir

    args = [str(llama_lib_dir()) if a == "LIB" else a for a in args]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_builds.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()  # nothing made before the arguments are checked


def test_interleaved_summary_errors_and_the_committed_files(tmp_path):
    script = str(ROOT / "scripts" / "interleaved_summary.py")
    r = _run(sys.executable, script, str(tmp_path / "missing.jsonl"))
    assert r.returncode != 0 and "is not a file" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, "docs/bench/kernels-v7-zen4/interleaved-qwen1.5b.jsonl")
    assert r.returncode == 0, r.stderr
    assert "n=1: llama.cpp's time / ours 1.007 (0.971-1.045)" in r.stdout  # the figure docs/kernels.md quotes
