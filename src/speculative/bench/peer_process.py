"""The subprocess plumbing that the out-of-process bench peers share (:mod:`.llama_server`, :mod:`.stock_peer`).

A peer runs an unmodified llama.cpp build in a process of its own, so it must run with that build's
defaults (:func:`peer_environment`), die with the bench (:func:`set_pdeathsig`), and be stopped
whole (:func:`stop_process`); the builds behind it run in a session of their own, ended whole if the
bench is interrupted (:func:`run_build_script`, :func:`end_process_group`). :func:`start_peer` opens
the peer's log with the command and what was left out of its environment, then starts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ..errors import BackendUnavailableError

#: variables a peer must not inherit from the bench process: llama.cpp's and ggml's settings (our backend sets
#: ``GGML_CPU_TILED_MM=0`` for exact numerics, which would switch off the default build's tiled K-quant matmul;
#: llama-server reads ``LLAMA_ARG_*``), and what would load other libraries than the peer's own
PEER_ENV_PREFIXES = ("GGML_", "LLAMA_", "DYLD_")
PEER_ENV_NAMES = ("LD_PRELOAD", "LD_LIBRARY_PATH")


def peer_environment() -> tuple[dict[str, str], list[str]]:
    """The environment a peer process runs with: this process's, less :data:`PEER_ENV_PREFIXES` and
    :data:`PEER_ENV_NAMES`, so that the peer runs with its build's defaults whatever our backend or the
    user set. Returns (environment, names removed)."""
    env = dict(os.environ)
    removed = sorted(k for k in env if k.startswith(PEER_ENV_PREFIXES) or k in PEER_ENV_NAMES)
    for k in removed:
        del env[k]
    return env, removed


def set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    """Linux: the calling (child) process gets SIGTERM when the bench process dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_peer(cmd: Sequence[str], log_path: Path, header: Sequence[str] = (), *, pipes: bool = False,
               ) -> tuple[subprocess.Popen, IO[str]]:
    """Start a peer process with :func:`peer_environment`, in a session of its own (Ctrl-C reaches the bench,
    which stops the peer itself) and with :func:`set_pdeathsig`.

    The log at ``log_path`` (made, with its folder) starts with ``$ command``, the variables left out and
    ``header`` lines as ``# `` comments. Without ``pipes`` the peer's stdout and stderr both go to the log and
    its stdin is empty; with ``pipes`` stdin and stdout are text pipes (line-buffered) for a protocol and stderr
    goes to the log. Returns (process, open log file), the log to be closed by the caller.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env, removed = peer_environment()
    log = open(log_path, "w")
    try:
        log.write("$ " + " ".join(map(str, cmd)) + "\n")
        if removed:
            log.write("# not passed on from the bench's environment: " + " ".join(removed) + "\n")
        log.writelines(f"# {line}\n" for line in header)
        log.flush()
        io = (dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1) if pipes
              else dict(stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        p = subprocess.Popen(list(map(str, cmd)), env=env, start_new_session=True,
                             preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None, **io)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        log.close()
        raise BackendUnavailableError(f"could not start {cmd[0]}: {e}") from None
    except BaseException:
        log.close()
        raise
    return p, log


def log_tail(log_path: Path, n: int) -> str:
    """The last ``n`` lines of a peer's log, less the header :func:`start_peer` wrote, joined by `` | `` for a
    one-line error ("" where the log cannot be read)."""
    try:
        lines = Path(log_path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join([x for x in lines if not x.startswith(("$ ", "# "))][-n:])


def run_build_script(script: Path, what: str, progress: bool) -> Path:
    """Run a build script that prints its output folder last on stdout; return that folder (``Path()`` if it
    printed nothing). Its stderr shows when ``progress``. It runs in a session of its own, ended whole
    (:func:`end_process_group`) if the bench is interrupted: the compilers must not outlive it.

    Raises:
        BackendUnavailableError: the script failed (the last lines of its stderr are quoted).
    """
    p = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE,
                         stderr=None if progress else subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate()
    except BaseException:
        end_process_group(p)
        raise
    if p.returncode != 0:
        tail = (err or "").strip().splitlines()[-3:]
        raise BackendUnavailableError(f"building {what} failed" + (": " + " | ".join(tail) if tail else ""))
    lines = out.strip().splitlines()
    return Path(lines[-1]) if lines else Path()


def end_process_group(p: subprocess.Popen) -> None:
    """SIGTERM to ``p``'s process group (a build script runs its own trap, which removes its temporary
    folder), up to 10 s for ``p`` to exit, then SIGKILL to what is left of the group (``p`` included if it
    is still running: members that ignore SIGTERM must not outlive the bench); waits for ``p``."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        p.wait()
        return
    try:
        p.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def stop_process(p: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate ``p`` if it still runs, then kill it after ``timeout_s``; waits for it either way."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def proc_status_mb(pid: int, key: str) -> float | None:
    """A memory figure of process ``pid`` from Linux ``/proc/PID/status`` (``VmRSS``, ``VmHWM``), MiB;
    None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None
