"""The stock llama-cpp-python peer (``--peer llama-cpp-python-stock``): its subprocess worker, its wiring in the
bench, its refusals, and the build script's cache. The stock build itself is never made here (minutes, and the
issue asks for it on demand only): the worker is pointed at the project's own llama_cpp instead, which makes
its tokens comparable, bit for bit, with the in-process peer's."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from speculative.bench.stock_peer import ENV_SITE, StockLlamaCppPythonPeer, stock_llama_cpp_python_site
from speculative.cli import main
from speculative.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[1]


def _our_site() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).resolve().parents[1]


def test_the_stock_peer_runs_in_a_subprocess_and_matches_the_in_process_peer(tmp_path, monkeypatch):
    """Both peers load the same llama_cpp here, so their greedy tokens must agree on every turn (MT-Bench's two
    turns included); the subprocess peer is labelled by where its package came from, not as stock."""
    monkeypatch.setenv(ENV_SITE, str(_our_site()))
    out = tmp_path / "b"
    code = main(["bench", "--categories", "mt_bench", "qa", "--per-category", "1", "--max-new-tokens", "12",
                 "--no-progress", "--peers", "none", "--peer", "llama-cpp-python", "--peer", "llama-cpp-python-stock",
                 "--peer", "llama-cpp-python-stock-lookup", "--output", str(out)])
    assert code == 0
    res = json.loads((out / "results.json").read_text())
    methods = {m["method"]: m for m in res["methods"]}
    sub = methods[f"llama-cpp-python ({ENV_SITE})"]
    assert sub["kind"] == "peer" and sub["unmodified"] is False and sub["new_tokens"] > 0
    assert f"llama-cpp-python lookup ({ENV_SITE})" in methods
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    by = {(r["question_id"], r["method"]): r for r in runs}
    for qid in {r["question_id"] for r in runs}:
        inproc = by[(qid, "llama-cpp-python (our build)")]
        for label in (f"llama-cpp-python ({ENV_SITE})", f"llama-cpp-python lookup ({ENV_SITE})"):
            r = by[(qid, label)]
            assert r["turn_token_ids"] == inproc["turn_token_ids"], (qid, label)
            assert 0 < r["prefill_time_s"] < r["wall_time_s"]
    assert len(by[(next(r["question_id"] for r in runs if r["category"] == "mt_bench"),
                   f"llama-cpp-python ({ENV_SITE})")]["turn_token_ids"]) == 2
    assert (out / "llama-cpp-python-stock.log").is_file()


@pytest.fixture(scope="module")
def smollm2():
    from speculative.backends import load_backend

    target = load_backend("smollm2-135m-instruct", "llama.cpp", n_ctx=512)
    yield target
    target.close()


def _peer(target, site, tmp_path, python=None, **timeouts):
    from speculative.models import resolve

    return StockLlamaCppPythonPeer(site, resolve("smollm2-135m-instruct").location, target, True, False, 512, 1,
                                   tmp_path, python=python, **timeouts)


def test_a_worker_that_imports_another_llama_cpp_is_refused(smollm2, tmp_path):
    """A site whose llama_cpp is a link to our patched package: the worker imports it, and the peer must refuse
    to call it stock."""
    site = tmp_path / "site"
    site.mkdir()
    for entry in _our_site().iterdir():
        (site / entry.name).symlink_to(entry)
    with pytest.raises(BackendUnavailableError, match="loaded .*llama_cpp.*, not the llama_cpp of"):
        _peer(smollm2, site, tmp_path)


def test_a_worker_that_maps_another_llama_library_is_refused(smollm2, tmp_path):
    """A package from the site that loads a ggml library from elsewhere (as LLAMA_CPP_LIB_PATH would make the
    real one do) is refused; its prints, Python's and native, do not break the protocol."""
    site = tmp_path / "site"
    (site / "llama_cpp").mkdir(parents=True)
    lib = _our_site() / "llama_cpp" / "lib" / "libggml-base.so"
    (site / "llama_cpp" / "__init__.py").write_text(
        "import ctypes, os\n"
        f"ctypes.CDLL({str(lib)!r})\n"
        "print('noise from Python')\n"
        "os.write(1, b'native noise\\n')\n"
        "__version__ = 'fake'\n"
        "class Llama:\n"
        "    def __init__(self, **kwargs):\n"
        "        pass\n"
    )
    with pytest.raises(BackendUnavailableError, match="libggml-base.so, not the llama_cpp of"):
        _peer(smollm2, site, tmp_path)
    assert "native noise" in (tmp_path / "llama-cpp-python-stock.log").read_text()


def test_a_worker_that_cannot_load_says_so_in_one_line(smollm2, tmp_path):
    empty = tmp_path / "site"
    empty.mkdir()
    with pytest.raises(BackendUnavailableError) as e:
        _peer(smollm2, empty, tmp_path)  # the base interpreter in isolated mode: no llama_cpp anywhere
    assert "ModuleNotFoundError" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "llama-cpp-python-stock.log").is_file()


def test_a_worker_that_dies_mid_run_is_an_error_not_a_hang(smollm2, tmp_path):
    from speculative.bench.datasets import load_questions
    from speculative.config import GenerationConfig

    peer = _peer(smollm2, _our_site(), tmp_path)
    try:
        peer.proc.kill()
        peer.proc.wait()
        with pytest.raises(BackendUnavailableError, match="worker exited \\(SIGKILL\\)"):
            peer.run(load_questions("dev")[0], GenerationConfig(max_new_tokens=4))
    finally:
        peer.close()


def test_a_worker_that_hangs_is_ended_after_its_timeout(smollm2, tmp_path):
    """A worker that never answers (here its llama_cpp sleeps at import) is ended, its whole session, after the
    load timeout, and the peer says so in one line."""
    site = tmp_path / "site"
    (site / "llama_cpp").mkdir(parents=True)
    (site / "llama_cpp" / "__init__.py").write_text("import os, sys, time\nprint('PID=%d' % os.getpid(), file=sys.stderr)\n"
                                                     "sys.stderr.flush()\ntime.sleep(600)\n")
    with pytest.raises(BackendUnavailableError) as e:
        _peer(smollm2, site, tmp_path, load_timeout_s=10)
    assert "gave no answer in 10 s and was ended" in str(e.value) and "\n" not in str(e.value)
    pid = int(next(w for w in (tmp_path / "llama-cpp-python-stock.log").read_text().split() if w.startswith("PID="))[4:])
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.quick
@pytest.mark.parametrize("argv, message", [
    (["--peer", "llama-cpp-python-stock", "--peer", "llama-cpp-python-stock"], "--peer llama-cpp-python-stock is given twice"),
    (["--drafter", "ngram", "--drafter", "ngram"], "--drafter ngram is given twice"),
    (["--peer", "llama-cpp-python-stock"], "holds no llama_cpp package"),
    (["--peer", "llama-server"], "is not an executable file"),
])
def test_bench_refuses_a_repeated_or_misdirected_peer_before_loading_anything(argv, message, tmp_path, monkeypatch,
                                                                              capsys):
    """No model loads, no worker or server starts: the target named does not even exist."""
    monkeypatch.setenv(ENV_SITE, str(tmp_path))
    monkeypatch.setenv("SPECULATIVE_LLAMA_SERVER", str(tmp_path / "nothing"))
    code = main(["bench", "--target", "no-such-model", "--per-category", "1", "--no-progress", "--peers", "none",
                 "--output", str(tmp_path / "b"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "b").exists()  # nothing written: the corrected command runs in the same folder


@pytest.mark.quick
def test_the_site_variable_must_name_a_llama_cpp_package(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_SITE, str(tmp_path))
    with pytest.raises(BackendUnavailableError, match="holds no llama_cpp package"):
        stock_llama_cpp_python_site(progress=False)
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text("")
    assert stock_llama_cpp_python_site(progress=False) == tmp_path


@pytest.mark.quick
@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="the cache key reads /proc/cpuinfo here")
def test_the_build_script_returns_a_complete_cache_at_once(tmp_path):
    """The cache key is version, Python, architecture and CPU flags; a complete entry is returned without
    building, an incomplete one (no build-info.txt: an interrupted publish) is not."""
    version = next(line.split("=", 1)[1] for line in (ROOT / "scripts/setup.sh").read_text().splitlines()
                   if line.startswith("LLAMA_CPP_VERSION="))
    py = ROOT / ".venv/bin/python"
    pyver = subprocess.run([str(py) if py.exists() else "python3", "-c",
                            'import sys; print("%d.%d" % sys.version_info[:2])'],
                           capture_output=True, text=True, check=True).stdout.strip()
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    script = ROOT / "scripts/build-stock-llama-cpp-python.sh"
    key = hashlib.sha256((flags + "\n").encode() + script.read_bytes()).hexdigest()[:12]
    amx = "-noamx" if " amx_tile" in flags + " " and os.environ.get("SPECULATIVE_LLAMA_AMX", "0") != "1" else ""
    dest = tmp_path / f"{version}-py{pyver}-{platform.machine()}-{key}{amx}"
    (dest / "site/llama_cpp").mkdir(parents=True)
    (dest / "site/llama_cpp/__init__.py").write_text("")
    env = {**os.environ, "SPECULATIVE_STOCK_LLAMA_CACHE": str(tmp_path)}
    # incomplete (no build-info.txt): it would build; on a PATH with the shell's tools but no cmake it stops at
    # once with a one-line reason, printing no folder
    tools = tmp_path / "bin"
    tools.mkdir()
    for t in ("sed", "grep", "sha256sum", "cut", "uname", "python3", "cat", "head", "tail", "mkdir", "dirname",
              "mktemp", "rm", "pwd", "basename"):
        found = subprocess.run(["bash", "-c", f"command -v {t}"], capture_output=True, text=True).stdout.strip()
        if found:
            (tools / t).symlink_to(found)
    r = subprocess.run([shutil.which("bash"), str(script)], capture_output=True, text=True,
                       env={**env, "PATH": str(tools)})
    assert r.returncode == 2 and r.stdout == "" and "cmake is needed" in r.stderr, r.stderr
    (dest / "build-info.txt").write_text("test\n")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(dest / "site") and "cached" in r.stderr
