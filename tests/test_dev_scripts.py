"""The measurement scripts of docs/kernels.md refuse bad arguments with one line, before any long work."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from speculative.kernels import llama_lib_dir

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
    (["--a", "/no/such", "--b", "/no/such", "--out", "x"], "/no/such: not a llama.cpp library folder"),
    (["--a", "LIB", "--b", "LIB", "--out", "x", "--rounds", "1"], "--rounds must be at least 2"),
    (["--a", "LIB", "--b", "LIB", "--out", "FILE"], "exists and is not a folder"),
    (["--out", "x", "--summary-only"], "no such folder"),
])
def test_ab_builds_usage_errors(tmp_path, args, fragment):
    (tmp_path / "FILE").write_text("")
    args = [str(llama_lib_dir()) if a == "LIB" else a for a in args]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_builds.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()  # nothing made before the arguments are checked


def _ab(tmp_path, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_builds.py"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_ab_builds_summary_of_bad_run_files(tmp_path):
    """--summary-only: every round found by default, a wrong --rounds refused, and each unreadable run file
    named in one line (summary.txt left as it was)."""
    import json
    import shutil

    out = tmp_path / "ab"
    shutil.copytree(ROOT / "docs" / "bench" / "kernels-v8-zen4" / "ab-qwen1.5b", out)
    before = (out / "summary.txt").read_text()
    r = _ab(tmp_path, "--out", str(out), "--summary-only", "--rounds", "3")
    assert r.returncode == 2 and "holds 6 paired rounds, not 3" in r.stderr, r.stderr
    assert (out / "summary.txt").read_text() == before
    r = _ab(tmp_path, "--out", str(out), "--summary-only")
    assert r.returncode == 0 and "T(1) A/B:" in r.stdout, r.stderr
    assert (out / "summary.txt").read_text().splitlines()[2:] == before.splitlines()[2:]
    good = (out / "B-2.json").read_text()
    for bad, fragment in [("{not json", "not a profile JSON file"),
                          (json.dumps({"t_ms": {"1": 30.0}}), "holds no T(8)"),
                          (json.dumps({"t_ms": {"1": 30.0, "8": 0}}), "T(8) = 0 is not a positive, finite time"),
                          (json.dumps({"t_ms": {"1": 30.0, "8": True}}), "T(8) = True is not a positive"),
                          ('{"t_ms": {"1": 30.0, "8": Infinity}}', "T(8) = inf is not a positive"),
                          (b"\xff\xfe", "cannot read it")]:
        (out / "B-2.json").write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        r = _ab(tmp_path, "--out", str(out), "--summary-only")
        assert r.returncode == 1 and "B-2.json" in r.stderr and fragment in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    (out / "B-2.json").write_text(good)


def test_ab_builds_installs_versioned_names_too(tmp_path):
    """A folder of unversioned libraries also replaces the versioned files the loader opens by soname."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from ab_builds import install
    finally:
        sys.path.pop(0)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "libggml.so").write_text("new")
    (src / "libllama.so.0").write_text("new llama")
    for name in ("libggml.so", "libggml.so.0", "libggml.so.0.25.3", "libllama.so", "libllama.so.0", "libggml-cpu.so.0"):
        (dst / name).write_text("old")
    install(src, dst)
    got = {f.name: f.read_text() for f in dst.iterdir()}
    assert got == {"libggml.so": "new", "libggml.so.0": "new", "libggml.so.0.25.3": "new", "libllama.so": "old",
                   "libllama.so.0": "new llama", "libggml-cpu.so.0": "old"}


def test_ab_builds_a_failing_profile_is_one_line_and_restores_the_libraries(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import ab_builds
    finally:
        sys.path.pop(0)
    a, b, lib = tmp_path / "a", tmp_path / "b", tmp_path / "lib"
    for d in (a, b, lib):
        d.mkdir()
        for n in ab_builds.LIBS:
            (d / n).write_text(d.name)
    monkeypatch.setattr(ab_builds, "lib_dir", lambda: lib)

    def fail(*args, **kwargs):
        raise subprocess.CalledProcessError(3, args[0])

    monkeypatch.setattr(ab_builds.subprocess, "run", fail)
    with pytest.raises(SystemExit) as e:
        ab_builds.main(["--a", str(a), "--b", str(b), "--out", str(tmp_path / "out")])
    assert "speculative profile failed (exit code 3)" in str(e.value) and "run files so far" not in str(e.value)
    assert all((lib / n).read_text() == "lib" for n in ab_builds.LIBS)
    with pytest.raises(SystemExit):
        ab_builds.main(["--a", str(a), "--b", str(b), "--out", str(tmp_path / "x" / "y" / "out")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()  # no empty folders left behind


def test_interleaved_summary_errors_and_the_committed_files(tmp_path):
    script = str(ROOT / "scripts" / "interleaved_summary.py")
    r = _run(sys.executable, script, str(tmp_path / "missing.jsonl"))
    assert r.returncode != 0 and "is not a file" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, "docs/bench/kernels-v7-zen4/interleaved-qwen1.5b.jsonl")
    assert r.returncode == 0, r.stderr
    assert "n=1: llama.cpp's time / ours 1.007 (0.971-1.045)" in r.stdout  # the figure docs/kernels.md quotes
    good = (ROOT / "docs/bench/kernels-v7-zen4/interleaved-qwen1.5b.jsonl").read_text()
    f = tmp_path / "run.jsonl"
    f.write_text(good + "\n\n")  # trailing blank lines are fine
    r = _run(sys.executable, script, str(f))
    assert r.returncode == 0 and "1.007 (0.971-1.045)" in r.stdout, r.stderr
    first = good.splitlines()[0]
    for bad, fragment in [("{not json", "line 2: not JSON"), ('{"round": 1}', "line 2: not a record"),
                          ('{"round": 1, "peer": "llama-bench", "n_gen": 64, "avg_ts": 0}', "line 2: a time or rate that is not"),
                          ('{"round": 1, "peer": "ours", "profile": {"t_ms": {"1": 0}}}', "line 2: a time or rate that is not"),
                          ('{"round": 1, "peer": "ours", "profile": {"t_ms": {"1": true}}}', "line 2: a time or rate that is not"),
                          ('{"round": 1, "peer": "ours", "profile": {"t_ms": {"1": "40"}}}', "line 2: a time or rate that is not"),
                          ('{"round": "1", "peer": "ours", "profile": {"t_ms": {"1": 40}}}', "line 2: not a record"),
                          ('[1, 2]', "line 2: not a record")]:
        f.write_text(first + "\n" + bad + "\n")
        r = _run(sys.executable, script, str(f))
        assert r.returncode == 1 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bench_kernels_summary_errors_and_the_committed_file(tmp_path):
    script = str(ROOT / "scripts" / "bench_kernels_summary.py")
    for args in ([], ["--help"], ["a", "b"]):
        r = _run(sys.executable, script, *args)
        assert r.returncode == 2 and r.stderr.startswith("usage:") and "Traceback" not in r.stderr
    r = _run(sys.executable, script, str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, str(tmp_path))  # a folder
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty.txt").write_text("peak: 468 GMAC/s\n")
    r = _run(sys.executable, script, str(tmp_path / "empty.txt"))
    assert r.returncode == 2 and "no bench_kernels runs" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, "docs/bench/kernels-v10-xeon/bench-kernels-ab.txt")
    assert r.returncode == 0, r.stderr
    # the figures docs/kernels.md quotes (Q4_K and Q6_K streaming, two threads, n = 1 and 8)
    assert "stream 2 thr q4_K  n=1  old   25.2 new   29.5 GB/s   ratio 1.17" in r.stdout
    assert "stream 2 thr q6_K  n=8  old   17.0 new   21.1 GB/s   ratio 1.24" in r.stdout
    # in cache, medians too (the drop docs/kernels.md mentions)
    assert "cache  2 thr q4_K  n=8  old  381.0 new  350.0 GMAC/s ratio 0.92" in r.stdout
    # and the rounds' paired ratios with their interval
    assert re.search(r"stream 2 thr q4_K  n=1  old   25.2 new   29.5 GB/s   ratio 1.17 \(rounds \d+/\d+\) "
                     r"paired \d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\)", r.stdout), r.stdout
    good = (ROOT / "docs/bench/kernels-v10-xeon/bench-kernels-ab.txt").read_text()
    # a third build: each later build against the first
    new_runs = [part.split("== build old,")[0] for part in good.split("== build new,")[1:]]
    (tmp_path / "three.txt").write_text(good + "".join("== build new2," + run for run in new_runs))
    r = _run(sys.executable, script, str(tmp_path / "three.txt"))
    assert r.returncode == 0 and "ratio new/old" in r.stdout and "ratio new2/old" in r.stdout, r.stderr
    # a header that does not parse must not let its run join the previous build's numbers
    bad = good.replace("== build new, round 2, 1 threads", "== build new round 2, 1 threads")
    (tmp_path / "bad.txt").write_text(bad)
    r = _run(sys.executable, script, str(tmp_path / "bad.txt"))
    assert r.returncode == 2 and "not a run header" in r.stderr and "Traceback" not in r.stderr
    # a header whose thread count is not the run's
    bad = good.replace("== build new, round 2, 1 threads", "== build new, round 2, 2 threads", 1)
    (tmp_path / "bad.txt").write_text(bad)
    r = _run(sys.executable, script, str(tmp_path / "bad.txt"))
    assert r.returncode == 2 and "the run says 1 threads, its header 2" in r.stderr
    # the same round twice for one build (two files concatenated): refused, not silently overwritten
    (tmp_path / "twice.txt").write_text(good + good)
    r = _run(sys.executable, script, str(tmp_path / "twice.txt"))
    assert r.returncode == 2 and "round 1 twice" in r.stderr and "Traceback" not in r.stderr
    # a zero rate: no division by zero
    zero = re.sub(r"(q4_K\s+compute \(in cache\):\s+n=1) \d+ GMAC/s", r"\1 0 GMAC/s", good)
    assert zero != good
    (tmp_path / "zero.txt").write_text(zero)
    r = _run(sys.executable, script, str(tmp_path / "zero.txt"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    # one build only: refused
    one = "".join(b for b in good.split("== build ") if b.startswith("old")).replace("old,", "== build old,")
    (tmp_path / "one.txt").write_text(one)
    r = _run(sys.executable, script, str(tmp_path / "one.txt"))
    assert r.returncode == 2 and "expected two or more builds" in r.stderr


def test_logits_compare_refuses_bad_folders_and_reports_a_failed_run(tmp_path):
    script = str(ROOT / "scripts" / "logits_compare.py")
    r = _run(sys.executable, script, str(tmp_path), str(tmp_path), "qwen2.5-coder-0.5b-instruct")
    assert r.returncode == 2 and "holds no libggml-cpu.so" in r.stderr and "Traceback" not in r.stderr
    r = _run(sys.executable, script, "a", "b", "m", "wrong")  # numerics must be exact or fast
    assert r.returncode == 2 and "invalid choice" in r.stderr
    libs = str(llama_lib_dir())
    r = _run(sys.executable, script, libs, libs, "no-such-model")
    assert r.returncode == 2 and r.stderr.startswith("error: the forwards under ") and "Traceback" not in r.stderr


def test_bench_kernels_lib_option_refuses_a_folder_without_the_library(tmp_path):
    script = str(ROOT / "scripts" / "bench_kernels.py")
    r = _run(sys.executable, script, "--lib", str(tmp_path), "2")
    assert r.returncode == 2 and "--lib needs a folder with libggml-cpu.so" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "libggml-cpu.so").write_bytes(b"")  # the unversioned name alone: the binary loads the .so.0
    r = _run(sys.executable, script, "--lib", str(tmp_path), "2")
    assert r.returncode == 2 and "--lib needs a folder" in r.stderr, r.stderr
    (tmp_path / "libggml-cpu.so.0").write_bytes(b"")  # libggml-cpu alone: the link needs libggml-base and libggml too
    r = _run(sys.executable, script, "--lib", str(tmp_path), "2")
    assert r.returncode == 2 and "--lib needs a folder" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _run(sys.executable, script, "--lib")
    assert r.returncode == 2 and "--lib needs a folder" in r.stderr, r.stderr
    r = _run(sys.executable, script, "2", "--lib", str(tmp_path))
    assert r.returncode == 2 and "--lib DIR must come first" in r.stderr, r.stderr
