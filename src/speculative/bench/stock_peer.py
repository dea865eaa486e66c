"""The stock llama-cpp-python peer: llama-cpp-python as pip builds it by default, in a process of its own.

The project's environment holds llama-cpp-python built with our patch (scripts/setup.sh), so the
in-process peer (:class:`.peers.LlamaCppPythonPeer`) measures our build. This peer measures the one a
user gets from ``pip install llama-cpp-python``: the pinned version, built from its sdist with no
``CMAKE_ARGS`` by ``scripts/build-stock-llama-cpp-python.sh`` into a folder of its own (on first use,
about 5 minutes on 2 cores, cached), and run by :mod:`.stock_worker` in a subprocess of the base Python
interpreter, which imports it from that folder. The same generation loop as the in-process peer; a
turn's wall time is taken here, around the request (the pipe and JSON add well under a millisecond),
its first token's time by the worker. It is an unmodified plain decoder: it may be the reference of
the headline ratios.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..backends.base import Backend
from ..config import GenerationConfig
from ..errors import BackendUnavailableError
from .datasets import Question
from .methods import Method, RunRecord, _TimedTurns
from .peer_process import end_process_group, log_tail, proc_status_mb, run_build_script, start_peer, stop_process

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-stock-llama-cpp-python.sh"
WORKER = Path(__file__).resolve().with_name("stock_worker.py")
ENV_SITE = "SPECULATIVE_STOCK_LLAMA_SITE"
#: draft tokens of the lookup variant (llama-cpp-python's own example uses 10; so does the in-process peer)
LOOKUP_TOKENS = 10
#: seconds the worker may take to load the model, and to answer one turn or reset, before it is ended
LOAD_TIMEOUT_S = 600.0
TURN_TIMEOUT_S = 3600.0


def site_from_environment() -> Path | None:
    """``$SPECULATIVE_STOCK_LLAMA_SITE`` as a folder holding a ``llama_cpp`` package, or None where it is unset.

    Raises:
        BackendUnavailableError: the variable names no such folder.
    """
    env = os.environ.get(ENV_SITE)
    if not env:
        return None
    p = Path(env).expanduser()
    if not (p / "llama_cpp" / "__init__.py").is_file():
        raise BackendUnavailableError(f"{ENV_SITE}={env} holds no llama_cpp package")
    return p


def stock_llama_cpp_python_site(progress: bool = True) -> Path:
    """The folder holding the stock ``llama_cpp`` package: ``$SPECULATIVE_STOCK_LLAMA_SITE``, else the
    cached default build, built on demand by ``scripts/build-stock-llama-cpp-python.sh``.

    Raises:
        BackendUnavailableError: the variable names no folder with a ``llama_cpp`` package, there is no build
            script (a non-editable install), or the build failed (the last lines of its log are quoted).
    """
    p = site_from_environment()
    if p is not None:
        return p
    if not BUILD_SCRIPT.is_file():
        raise BackendUnavailableError(
            "the llama-cpp-python-stock peers need scripts/build-stock-llama-cpp-python.sh from a source checkout, "
            f"or {ENV_SITE}=/folder/holding/llama_cpp"
        )
    if progress:
        print("llama-cpp-python-stock: building or locating the stock llama-cpp-python "
              "(scripts/build-stock-llama-cpp-python.sh)", file=sys.stderr)
    p = run_build_script(BUILD_SCRIPT, "the stock llama-cpp-python", progress)
    if not (p / "llama_cpp" / "__init__.py").is_file():
        raise BackendUnavailableError(f"scripts/build-stock-llama-cpp-python.sh reported no llama_cpp package ({p})")
    return p


def base_python() -> str:
    """The interpreter the project's virtual environment was made from (its site-packages not on the path)."""
    return getattr(sys, "_base_executable", None) or sys.executable


class StockLlamaCppPythonPeer(Method):
    """llama-cpp-python's ``Llama`` from ``site``, plain or with ``LlamaPromptLookupDecoding``, in a subprocess.

    Args:
        site: folder holding the ``llama_cpp`` package to load (:func:`stock_llama_cpp_python_site`).
        gguf_path: the target's GGUF file. target: our backend of the same model (chat template, decoding).
        chat: apply the chat template. lookup: prompt lookup decoding instead of plain.
        n_ctx, n_threads: as the other peers. log_dir: the worker's stderr goes to
            ``log_dir/llama-cpp-python-stock[-lookup].log``.
        unmodified: whether ``site`` is the stock build (False where ``$SPECULATIVE_STOCK_LLAMA_SITE`` chose it).
        python: the interpreter to run the worker (default :func:`base_python`).
        load_timeout_s, turn_timeout_s: seconds allowed for loading, and for one turn or reset; a worker that
            takes longer is ended and the peer raises.

    Raises:
        BackendUnavailableError: the worker exited or reported an error while loading (the log's tail is
            quoted), did not answer in time, or imported a ``llama_cpp`` package or mapped a llama/ggml library
            from outside ``site``.

    The worker runs with :func:`.peer_process.peer_environment`: no ``GGML_*``/``LLAMA_*`` settings (our
    backend sets ``GGML_CPU_TILED_MM=0``, which the stock library reads too), no ``LD_PRELOAD`` or
    ``LD_LIBRARY_PATH``.
    """

    kind = "peer"

    def __init__(self, site: str | Path, gguf_path: str, target: Backend, chat: bool, lookup: bool, n_ctx: int,
                 n_threads: int, log_dir: str | Path, unmodified: bool = True, python: str | None = None,
                 load_timeout_s: float = LOAD_TIMEOUT_S, turn_timeout_s: float = TURN_TIMEOUT_S):
        self.site = Path(site).resolve()
        self.load_timeout_s, self.turn_timeout_s = load_timeout_s, turn_timeout_s
        self.plain = not lookup
        self.unmodified = unmodified
        tag = "stock" if unmodified else ENV_SITE
        self.label = "llama-cpp-python" + (" lookup" if lookup else "") + f" ({tag})"
        name = "llama-cpp-python-stock" + ("-lookup" if lookup else "")
        self.log_path = Path(log_dir) / f"{name}.log"
        self.turns = _TimedTurns(target, chat)
        self.eos = sorted(target.eos_token_ids)
        # -I -S: no user site, no PYTHONPATH, no site-packages; only the standard library and --site
        cmd = [python or base_python(), "-I", "-S", str(WORKER), "--site", str(self.site), "--model", str(gguf_path),
               "--n-ctx", str(n_ctx), "--threads", str(n_threads), "--lookup", str(LOOKUP_TOKENS if lookup else 0)]
        info = self.site.parent / "build-info.txt"
        header = info.read_text().splitlines() if info.is_file() else []
        self.proc: subprocess.Popen | None
        self.proc, self._log = start_peer(cmd, self.log_path, header, pipes=True)
        ready = self._receive("ready", self.load_timeout_s)
        outside = [str(p) for p in [ready.get("llama_cpp") or "", *(ready.get("libraries") or [])]
                   if not Path(p).resolve().is_relative_to(self.site)]
        if outside:
            self.close()
            raise BackendUnavailableError(f"the {name} worker loaded {outside[0]}, not the llama_cpp of {self.site}")
        self.version = ready.get("version")
        self.load_rss_mb = proc_status_mb(self.proc.pid, "VmRSS")

    def _receive(self, key: str, timeout_s: float) -> dict:
        """The worker's next message, which must hold ``key``; else (or after ``timeout_s`` without one) the
        worker is ended and the error raised."""
        proc = self.proc
        late = threading.Event()
        lock = threading.Lock()
        answered = False

        def expire() -> None:
            with lock:  # an answer read just before the timer fired wins: the worker is then left alone
                if answered:
                    return
                late.set()
            end_process_group(proc)  # the readline below then sees end of file

        watchdog = threading.Timer(timeout_s, expire) if proc is not None else None
        if watchdog is not None:
            watchdog.daemon = True
            watchdog.start()
        try:
            line = proc.stdout.readline() if proc is not None else ""
        finally:
            with lock:
                answered = True
            if watchdog is not None:
                watchdog.cancel()
        what = None
        try:
            msg = json.loads(line) if line else None
        except ValueError:
            msg, what = None, f"sent an answer that is not JSON ({line[:120]!r})"
        if late.is_set():  # ended by the watchdog, whatever it sent last
            msg, what = None, f"gave no answer in {timeout_s:g} s and was ended"
        if isinstance(msg, dict) and key in msg:
            return msg
        if isinstance(msg, dict) and "error" in msg:
            what = f"failed: {msg['error']}"
        elif what is None and msg is not None:
            what = f"sent an answer without {key!r} ({line[:120]!r})"
        elif what is None:
            code = self.proc.wait() if self.proc is not None else None
            what = f"exited (code {code})"
            if code is not None and code < 0:
                try:
                    what = f"exited ({signal.Signals(-code).name})"
                except ValueError:
                    pass
        self.close()
        raise BackendUnavailableError(f"the stock llama-cpp-python worker {what}; log {self.log_path}: {log_tail(self.log_path, 3)}")

    def _send(self, req: dict) -> None:
        if self.proc is None:
            raise BackendUnavailableError(f"the stock llama-cpp-python worker is not running (log {self.log_path})")
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # the worker died: _receive reports it with its log

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        s = cfg.sampling

        def turn(ids):
            req = {"ids": list(map(int, ids)), "max_new": cfg.max_new_tokens, "temp": s.temperature,
                   "top_k": s.top_k if s.top_k else (1 if s.greedy else 0), "top_p": s.top_p, "seed": s.seed,
                   "eos": self.eos}
            t_send = time.perf_counter()
            self._send(req)
            ans = self._receive("tokens", self.turn_timeout_s)
            first = ans.get("first_s")
            return ans["tokens"], (t_send + first) if first is not None else None, None, None

        # cold start per question, outside the clock; later turns reuse the prefix, as the in-process peer
        self._send({"reset": True})
        self._receive("reset", self.turn_timeout_s)
        rec = self.turns.run_turns(question, turn)
        if self.proc is not None:
            peak = proc_status_mb(self.proc.pid, "VmHWM")
            if peak is not None:
                rec.extra["rss_peak_mb"] = peak
        return rec

    def close(self) -> None:
        """End the worker (EOF, then terminate after 10 s); idempotent."""
        p, self.proc = self.proc, None
        if p is not None:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_process(p)
            p.stdout.close()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
