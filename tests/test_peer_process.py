"""The subprocess plumbing of the out-of-process peers (llama-server, the stock llama-cpp-python worker):
their environment, their start and log, the build-script runner."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from speculative.bench.peer_process import end_process_group, peer_environment, run_build_script, start_peer, stop_process
from speculative.errors import BackendUnavailableError


@pytest.mark.quick
def test_the_peer_runs_without_our_llama_settings(monkeypatch):
    """Our backend sets GGML_CPU_TILED_MM=0, which the stock library and llama-server read too: a peer must not
    inherit it, nor libraries forced by LD_PRELOAD, LD_LIBRARY_PATH or LLAMA_CPP_LIB_PATH."""
    for k, v in {"GGML_CPU_TILED_MM": "0", "LLAMA_CPP_LIB_PATH": "/x", "LD_PRELOAD": "/y.so",
                 "LD_LIBRARY_PATH": "/z", "LLAMA_ARG_CTX_SIZE": "8", "SPECULATIVE_KEEP": "1"}.items():
        monkeypatch.setenv(k, v)
    env, removed = peer_environment()
    assert {"GGML_CPU_TILED_MM", "LLAMA_CPP_LIB_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LLAMA_ARG_CTX_SIZE"} <= set(removed)
    assert not set(removed) & set(env) and env["SPECULATIVE_KEEP"] == "1" and env["PATH"] == os.environ["PATH"]


@pytest.mark.quick
def test_a_peer_starts_in_a_session_of_its_own_with_its_log_headed(tmp_path, monkeypatch):
    """The log names the command, the variables left out and the header; the peer has its own session (Ctrl-C
    in the bench's terminal does not reach it), talks over pipes, and is stopped."""
    monkeypatch.setenv("GGML_CPU_TILED_MM", "0")
    log = tmp_path / "logs" / "peer.log"
    # stderr first: the parent stops the peer once stdout's line arrives (at once under PYTHONUNBUFFERED)
    cmd = ["python3", "-c", "import os, sys; print('to the log', file=sys.stderr, flush=True); "
           "print(os.getsid(0), os.environ.get('GGML_CPU_TILED_MM'), flush=True); sys.stdin.readline()"]
    p, f = start_peer(cmd, log, ["built by a test"], pipes=True)
    try:
        sid, tiled = p.stdout.readline().split()
        assert int(sid) == p.pid and sid != str(os.getsid(0)) and tiled == "None"
    finally:
        stop_process(p, timeout_s=5)
        p.stdin.close()
        p.stdout.close()
        f.close()
    text = log.read_text().splitlines()
    assert text[0].startswith("$ python3 -c") and "GGML_CPU_TILED_MM" in text[1]
    assert text[2] == "# built by a test" and "to the log" in text


@pytest.mark.quick
def test_a_peer_that_cannot_start_is_a_one_line_error(tmp_path):
    with pytest.raises(BackendUnavailableError, match="could not start /no/such/binary"):
        start_peer(["/no/such/binary"], tmp_path / "peer.log")
    assert (tmp_path / "peer.log").read_text().startswith("$ /no/such/binary")


@pytest.mark.quick
def test_stop_process_kills_what_ignores_sigterm(tmp_path):
    p, f = start_peer(["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                       "print('ready', flush=True); time.sleep(60)"], tmp_path / "peer.log", pipes=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    stop_process(p, timeout_s=1)
    p.stdin.close()
    p.stdout.close()
    f.close()
    assert p.returncode == -9 and time.monotonic() - t0 < 10


@pytest.mark.quick
def test_run_build_script_returns_the_folder_it_prints_and_quotes_a_failure(tmp_path):
    ok = tmp_path / "ok.sh"
    ok.write_text("echo building >&2\necho /some/where\necho /the/folder\n")
    assert run_build_script(ok, "a thing", progress=False) == Path("/the/folder")
    bad = tmp_path / "bad.sh"
    bad.write_text("echo first >&2\necho why it failed >&2\nexit 1\n")
    with pytest.raises(BackendUnavailableError, match=r"^building a thing failed: first \| why it failed$"):
        run_build_script(bad, "a thing", progress=False)


@pytest.mark.quick
def test_end_process_group_kills_a_member_that_ignores_sigterm_after_its_leader_exits(tmp_path):
    """The leader exits on SIGTERM at once; its child ignores SIGTERM: the child must not outlive the call."""
    script = tmp_path / "leader.sh"
    script.write_text("(trap '' TERM; sleep 60) & echo $! ; wait\n")
    p = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(p.stdout.readline())
    time.sleep(0.2)  # the child's trap is set
    t0 = time.monotonic()
    end_process_group(p)
    p.stdout.close()
    assert time.monotonic() - t0 < 9  # the leader went on SIGTERM: no 10 s wait
    for _ in range(50):  # the killed child is reaped by init a moment later
        try:
            state = Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child {child} that ignores SIGTERM is still running")
