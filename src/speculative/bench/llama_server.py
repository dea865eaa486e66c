"""llama.cpp's own ``llama-server`` as a bench peer: plain decoding and its C++ speculative decoding.

The server is built from the llama.cpp source inside the pinned llama-cpp-python
sdist with llama.cpp's default CPU kernels (``scripts/build-llama-tools.sh``,
cached per version and CPU; the bench builds it on first use), started as a
subprocess on a free loopback port with the same GGUF files, threads and context
as our methods, and driven through its native ``/completion`` endpoint, whose
``timings`` give the prompt time and, with a draft model, the draft counts
(``draft_n``, ``draft_n_accepted``). One slot (``-np 1``), no host-memory prompt
cache (``-cram 0``), and each question starts cold (``cache_prompt`` is off for its
first turn, on for later turns, as our methods reuse a question's own prefix).

Variants (``--peer NAME``):

- ``llama-server``: plain decoding.
- ``llama-server-spec``: ``--model-draft DRAFT`` with the recipe published for
  same-family pairs: ``--spec-type draft-simple --spec-draft-n-max 16
  --spec-draft-n-min 5 --spec-draft-p-min 0.9``.
- ``llama-server-spec-defaults``: ``--model-draft DRAFT --spec-type draft-simple``
  with llama.cpp's default draft parameters (n_max 3, n_min 0, p_min 0). In this
  llama.cpp version ``--model-draft`` alone loads the draft model but drafts
  nothing: the speculative type must be named.
- ``llama-server-ngram``: llama.cpp's prompt lookup, ``--spec-type ngram-simple``
  (its defaults), no draft model.
- ``llama-server-ngram-mod``: ``--spec-type ngram-mod``, llama.cpp's n-gram drafter
  whose hash pool is kept across requests (its closest kin to suffix decoding).

``SPECULATIVE_LLAMA_SERVER=/path/to/llama-server`` uses another build instead. The server
runs with the bench's environment less llama.cpp's and ggml's variables (:func:`.peer_process.peer_environment`):
our backend sets ``GGML_CPU_TILED_MM=0`` for exact numerics, which the default build also reads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..backends.base import Backend
from ..config import GenerationConfig
from ..errors import BackendUnavailableError, ConfigError
from .datasets import Question
from .methods import Method, RunRecord, _TimedTurns
from .peer_process import log_tail, proc_status_mb, run_build_script, start_peer, stop_process

#: speculative flags per variant (None: plain decoding, no draft model)
VARIANTS: dict[str, tuple[str, ...] | None] = {
    "llama-server": None,
    "llama-server-spec": ("--spec-type", "draft-simple", "--spec-draft-n-max", "16", "--spec-draft-n-min", "5",
                          "--spec-draft-p-min", "0.9"),
    "llama-server-spec-defaults": ("--spec-type", "draft-simple"),
    "llama-server-ngram": ("--spec-type", "ngram-simple"),
    "llama-server-ngram-mod": ("--spec-type", "ngram-mod"),
}
#: the variants that run a draft model (``--model-draft``)
DRAFT_VARIANTS = frozenset({"llama-server-spec", "llama-server-spec-defaults"})

BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-llama-tools.sh"
HEALTH_TIMEOUT_S = 600.0


def binary_from_environment() -> Path | None:
    """``$SPECULATIVE_LLAMA_SERVER`` as an executable file, or None where it is unset.

    Raises:
        BackendUnavailableError: the variable names no executable file.
    """
    env = os.environ.get("SPECULATIVE_LLAMA_SERVER")
    if not env:
        return None
    p = Path(env).expanduser()
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise BackendUnavailableError(f"SPECULATIVE_LLAMA_SERVER={env} is not an executable file")
    return p


def llama_server_binary(progress: bool = True) -> Path:
    """The ``llama-server`` to run: ``$SPECULATIVE_LLAMA_SERVER``, else the cached default build,
    built on demand by ``scripts/build-llama-tools.sh`` (about 6 minutes on 2 cores, once).

    Raises:
        BackendUnavailableError: no binary and no build script (a non-editable install), or the build failed.
    """
    p = binary_from_environment()
    if p is not None:
        return p
    if not BUILD_SCRIPT.is_file():
        raise BackendUnavailableError(
            "the llama-server peers need llama.cpp's tools: run scripts/build-llama-tools.sh from a source checkout "
            "or set SPECULATIVE_LLAMA_SERVER=/path/to/llama-server"
        )
    if progress:
        print("llama-server: building or locating llama.cpp's tools (scripts/build-llama-tools.sh)", file=sys.stderr)
    p = run_build_script(BUILD_SCRIPT, "llama.cpp's tools", progress) / "llama-server"
    if not p.is_file():
        raise BackendUnavailableError(f"scripts/build-llama-tools.sh reported no llama-server ({p})")
    return p


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(binary: str | Path, model: str, port: int, n_ctx: int, threads: int,
                   draft: str | None = None, spec_flags: Sequence[str] | None = None) -> list[str]:
    """The ``llama-server`` command line of one variant.

    Args:
        binary: the ``llama-server`` executable.
        model: target GGUF path; ``draft``: draft GGUF path (required with ``spec_flags`` that name
            ``draft-simple``; n-gram variants run without one).
        port: loopback port; n_ctx: context tokens; threads: generation and batch threads.
        spec_flags: speculative flags of the variant (None: plain decoding).

    Raises:
        ConfigError: speculative flags without a draft model.
    """
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
           "-t", str(threads), "-tb", str(threads), "-np", "1", "-cram", "0", "--no-webui"]
    if spec_flags is not None:
        if "draft-simple" in spec_flags:
            if not draft:
                raise ConfigError("a llama-server speculative peer needs a draft model (--peer-draft MODEL)")
            cmd += ["--model-draft", str(draft)]
        cmd += list(spec_flags)
    return cmd


@dataclass
class CompletionResult:
    """What one ``/completion`` response says (``timings`` in milliseconds, as the server reports them)."""

    tokens: list[int] | None
    text: str
    n_tokens: int
    prompt_ms: float
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int


def completion_request(prompt_ids: Sequence[int], cfg: GenerationConfig, cache_prompt: bool) -> dict:
    """The ``/completion`` body: token-id prompt, the bench's sampling, no other samplers' effects."""
    s = cfg.sampling
    body = {
        "prompt": [int(t) for t in prompt_ids],
        "n_predict": int(cfg.max_new_tokens),
        "temperature": float(s.temperature),
        "top_k": int(s.top_k),
        "top_p": float(s.top_p),
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "cache_prompt": bool(cache_prompt),
        "return_tokens": True,
        "stream": False,
    }
    if s.seed is not None:
        body["seed"] = int(s.seed)
    return body


def parse_completion(resp: dict) -> CompletionResult:
    """Read a native ``/completion`` response: text, token ids, token count and ``timings``.

    Raises:
        BackendUnavailableError: the server answered an error object or no ``timings``.
    """
    if "error" in resp:
        err = resp["error"]
        raise BackendUnavailableError(f"llama-server error: {err.get('message', err) if isinstance(err, dict) else err}")
    t = resp.get("timings")
    if not isinstance(t, dict):
        raise BackendUnavailableError("llama-server answered without 'timings'")
    toks = resp.get("tokens")
    n = int(t.get("predicted_n", resp.get("tokens_predicted", len(toks or []))))
    return CompletionResult(
        tokens=[int(x) for x in toks] if toks else None,
        text=str(resp.get("content", "")),
        n_tokens=n,
        prompt_ms=float(t.get("prompt_ms", 0.0)),
        predicted_ms=float(t.get("predicted_ms", 0.0)),
        draft_n=int(t.get("draft_n", 0)),
        draft_n_accepted=int(t.get("draft_n_accepted", 0)),
    )


class LlamaServerProcess:
    """A ``llama-server`` subprocess on a free loopback port, ready once ``/health`` answers 200.

    Raises:
        BackendUnavailableError: the server exited or did not become healthy (its log's tail is quoted).
    """

    def __init__(self, cmd_for_port, log_path: Path, timeout_s: float = HEALTH_TIMEOUT_S):
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        for _attempt in range(3):  # another process may take the free port before the server binds it
            self.port = free_port()
            self.cmd = cmd_for_port(self.port)
            self.proc, self._log = start_peer(self.cmd, self.log_path)
            if self._wait_healthy(timeout_s):
                return
            tail = self.log_tail().lower()
            bound_elsewhere = "bind" in tail or "address already in use" in tail
            self.stop()
            if not bound_elsewhere:
                break
        raise BackendUnavailableError(f"llama-server did not start (log {self.log_path}): {self.log_tail(3)}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass  # 503 while loading, refused before it listens
            time.sleep(0.25)
        return False

    def log_tail(self, n: int = 20) -> str:
        return log_tail(self.log_path, n)

    def post(self, path: str, body: dict, timeout_s: float = 3600.0) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                return json.loads(e.read())
            except ValueError:
                raise BackendUnavailableError(f"llama-server HTTP {e.code} on {path}") from None
        except (urllib.error.URLError, OSError) as e:
            alive = self.proc is not None and self.proc.poll() is None
            raise BackendUnavailableError(
                f"llama-server {'did not answer' if alive else 'exited'} ({e}); log {self.log_path}: {self.log_tail(3)}"
            ) from None

    def peak_rss_mb(self) -> float | None:
        """The server's peak resident memory so far (Linux ``VmHWM``), MiB."""
        return proc_status_mb(self.proc.pid, "VmHWM") if self.proc is not None else None

    def rss_mb(self) -> float | None:
        return proc_status_mb(self.proc.pid, "VmRSS") if self.proc is not None else None

    def stop(self) -> None:
        """Terminate (then kill after 10 s) the server; idempotent."""
        p, self.proc = self.proc, None
        if p is not None:
            stop_process(p)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None


class LlamaServerPeer(Method):
    """One ``llama-server`` variant (see the module doc), timed from the client.

    The turn's prefill time is the server's own ``prompt_ms``; decoding is the rest of
    the client-side wall time (HTTP and JSON included, a few milliseconds). Draft counts
    go to ``RunRecord.extra``; text is compared with our plain greedy text.
    """

    kind = "peer"
    compare_by = "text"

    def __init__(self, name: str, binary: str | Path, model: str, target: Backend, chat: bool, n_ctx: int,
                 threads: int, log_dir: Path, draft: str | None = None):
        if name not in VARIANTS:
            raise ConfigError(f"unknown llama-server peer '{name}': choose from {', '.join(VARIANTS)}")
        self.label = name
        self.plain = VARIANTS[name] is None
        # llama.cpp's default build (scripts/build-llama-tools.sh), unless SPECULATIVE_LLAMA_SERVER names another
        self.unmodified = not os.environ.get("SPECULATIVE_LLAMA_SERVER")
        self.draft = None if self.plain else draft
        cmd = lambda port: server_command(binary, model, port, n_ctx, threads, self.draft, VARIANTS[name])  # noqa: E731
        cmd(0)  # validate (a missing draft model) before starting anything
        self.server = LlamaServerProcess(cmd, Path(log_dir) / f"{name}.log")
        self.turns = _TimedTurns(target, chat)
        self.load_rss_mb = self.server.rss_mb()

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        counts = {"draft_n": 0, "draft_n_accepted": 0}
        first = [True]

        def turn(ids):
            t_send = time.perf_counter()
            res = parse_completion(self.server.post("/completion", completion_request(ids, cfg, not first[0])))
            first[0] = False
            counts["draft_n"] += res.draft_n
            counts["draft_n_accepted"] += res.draft_n_accepted
            return res.tokens, t_send + res.prompt_ms / 1000.0, res.text, res.n_tokens

        rec = self.turns.run_turns(question, turn)
        if not self.plain:
            rec.extra.update(counts)
        peak = self.server.peak_rss_mb()
        if peak is not None:
            rec.extra["rss_peak_mb"] = peak
        return rec

    def close(self) -> None:
        self.server.stop()
