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
import subprocess
import sys
import time
from pathlib import Path

from ..backends.base import Backend
from ..config import GenerationConfig
from ..errors import BackendUnavailableError
from .datasets import Question
from .llama_server import _proc_status_mb, _set_pdeathsig
from .methods import Method, RunRecord, _TimedTurns

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-stock-llama-cpp-python.sh"
WORKER = Path(__file__).resolve().with_name("stock_worker.py")
ENV_SITE = "SPECULATIVE_STOCK_LLAMA_SITE"
#: draft tokens of the lookup variant (llama-cpp-python's own example uses 10; so does the in-process peer)
LOOKUP_TOKENS = 10


def stock_llama_cpp_python_site(progress: bool = True) -> Path:
    """The folder holding the stock ``llama_cpp`` package: ``$SPECULATIVE_STOCK_LLAMA_SITE``, else the
    cached default build, built on demand by ``scripts/build-stock-llama-cpp-python.sh``.

    Raises:
        BackendUnavailableError: the variable names no folder with a ``llama_cpp`` package, there is no build
            script (a non-editable install), or the build failed (the last lines of its log are quoted).
    """
    env = os.environ.get(ENV_SITE)
    if env:
        p = Path(env).expanduser()
        if not (p / "llama_cpp" / "__init__.py").is_file():
            raise BackendUnavailableError(f"{ENV_SITE}={env} holds no llama_cpp package")
        return p
    if not BUILD_SCRIPT.is_file():
        raise BackendUnavailableError(
            "the llama-cpp-python-stock peers need scripts/build-stock-llama-cpp-python.sh from a source checkout, "
            f"or {ENV_SITE}=/folder/holding/llama_cpp"
        )
    if progress:
        print("llama-cpp-python-stock: building or locating the stock llama-cpp-python "
              "(scripts/build-stock-llama-cpp-python.sh)", file=sys.stderr)
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                       stderr=None if progress else subprocess.PIPE, text=True)
    if r.returncode != 0:
        tail = (r.stderr or "").strip().splitlines()[-3:]
        raise BackendUnavailableError("building the stock llama-cpp-python failed" + (": " + " | ".join(tail) if tail else ""))
    lines = r.stdout.strip().splitlines()
    p = Path(lines[-1]) if lines else Path()
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

    Raises:
        BackendUnavailableError: the worker exited or reported an error while loading (the log's tail is
            quoted), or it imported a ``llama_cpp`` from outside ``site``.
    """

    kind = "peer"

    def __init__(self, site: str | Path, gguf_path: str, target: Backend, chat: bool, lookup: bool, n_ctx: int,
                 n_threads: int, log_dir: str | Path, unmodified: bool = True, python: str | None = None):
        self.site = Path(site).resolve()
        self.plain = not lookup
        self.unmodified = unmodified
        tag = "stock" if unmodified else ENV_SITE
        self.label = "llama-cpp-python" + (" lookup" if lookup else "") + f" ({tag})"
        name = "llama-cpp-python-stock" + ("-lookup" if lookup else "")
        self.log_path = Path(log_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.turns = _TimedTurns(target, chat)
        self.eos = sorted(target.eos_token_ids)
        cmd = [python or base_python(), "-I", str(WORKER), "--site", str(self.site), "--model", str(gguf_path),
               "--n-ctx", str(n_ctx), "--threads", str(n_threads), "--lookup", str(LOOKUP_TOKENS if lookup else 0)]
        self._log = open(self.log_path, "w")
        self._log.write("$ " + " ".join(cmd) + "\n")
        self._log.flush()
        self.proc: subprocess.Popen | None = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
            start_new_session=True, preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None,
        )
        ready = self._receive()
        loaded = Path(ready.get("llama_cpp", "")).resolve()
        if not loaded.is_relative_to(self.site):
            self.close()
            raise BackendUnavailableError(f"the {name} worker imported {loaded}, not the llama_cpp of {self.site}")
        self.version = ready.get("version")
        self.load_rss_mb = _proc_status_mb(self.proc.pid, "VmRSS")

    def _log_tail(self, n: int = 3) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def _receive(self) -> dict:
        line = self.proc.stdout.readline() if self.proc is not None else ""
        try:
            msg = json.loads(line) if line else None
        except ValueError:
            msg = {"error": f"unreadable answer {line[:200]!r}"}
        if msg is None or "error" in msg:
            what = msg["error"] if msg else f"exited (code {self.proc.wait() if self.proc else '?'})"
            self.close()
            raise BackendUnavailableError(f"the stock llama-cpp-python worker {what}; log {self.log_path}: {self._log_tail()}")
        return msg

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        s = cfg.sampling
        first_turn = [True]

        def turn(ids):
            if self.proc is None:
                raise BackendUnavailableError(f"the stock llama-cpp-python worker is not running (log {self.log_path})")
            req = {"ids": list(map(int, ids)), "max_new": cfg.max_new_tokens, "temp": s.temperature,
                   "top_k": s.top_k if s.top_k else (1 if s.greedy else 0), "top_p": s.top_p, "seed": s.seed,
                   "eos": self.eos, "reset": first_turn[0]}
            first_turn[0] = False
            t_send = time.perf_counter()
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # the worker died: _receive reports it with its log
            ans = self._receive()
            first = ans.get("first_s")
            return ans["tokens"], (t_send + first) if first is not None else None, None, None

        rec = self.turns.run_turns(question, turn)
        if self.proc is not None:
            peak = _proc_status_mb(self.proc.pid, "VmHWM")
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
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            p.stdout.close()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
