"""The stock llama-cpp-python peer's worker: one llama-cpp-python ``Llama`` in a process of its own.

Run by :class:`speculative.bench.stock_peer.StockLlamaCppPythonPeer` with the base Python interpreter
in isolated mode and without site-packages (``python -I -S stock_worker.py --site DIR ...``), so that
it imports the llama-cpp-python installed in ``--site`` (the stock build of
``scripts/build-stock-llama-cpp-python.sh``) and never the patched one of the project's environment.
It imports nothing from ``speculative``. Its stdout is the protocol's alone: whatever else writes to
file descriptor 1 (the library's native messages, a ``print``) goes to stderr, the log.

Protocol, one JSON object per line:

- after loading, on stdout: ``{"ready": true, "llama_cpp": <path of the imported package>, "version": ...,
  "libraries": [<paths of the llama and ggml shared libraries mapped, from /proc/self/maps; [] elsewhere>]}``,
  or ``{"error": "..."}`` and exit 1;
- each request on stdin: ``{"ids": [int, ...], "max_new": int, "temp": float, "top_k": int, "top_p": float,
  "seed": int | null, "eos": [int, ...]}``, answered by ``{"tokens": [int, ...], "first_s": float | null,
  "total_s": float}`` (seconds from reading the request to the first token and to the last);
- ``{"reset": true}`` (a new question: the cache emptied, so that it starts cold), answered by
  ``{"reset": true}``;
- a failed request is answered by ``{"error": "..."}``.

EOF on stdin ends the worker. The generation loop is the in-process peer's
(:class:`speculative.bench.peers.LlamaCppPythonPeer`): the same calls and sampling settings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


_protocol = sys.stdout


def _send(obj: dict) -> None:
    _protocol.write(json.dumps(obj) + "\n")
    _protocol.flush()


def _own_stdout_for_the_protocol() -> None:
    """Keep file descriptor 1's pipe for the protocol alone: the pipe moves to a new descriptor, and
    descriptor 1 (native writes) and ``sys.stdout`` (Python's) go to stderr."""
    global _protocol
    sys.stdout.flush()
    _protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def _loaded_libraries() -> list[str]:
    """Paths of the llama/ggml shared libraries this process has mapped (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(("libllama", "libggml")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True, help="the folder holding the llama_cpp package to load")
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--n-ctx", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--lookup", type=int, default=0, help="prompt lookup draft tokens (0: plain decoding)")
    a = ap.parse_args(argv)
    _own_stdout_for_the_protocol()
    sys.path.insert(0, a.site)
    try:
        import llama_cpp

        kwargs = dict(model_path=a.model, n_ctx=a.n_ctx, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
        if a.lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=a.lookup)
            kwargs["logits_all"] = True  # llama-cpp-python 0.3.36 sizes its score buffer by this flag alone
        llm = llama_cpp.Llama(**kwargs)
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        _send({"error": f"{type(e).__name__}: {e}"})
        return 1
    _send({"ready": True, "llama_cpp": llama_cpp.__file__, "version": getattr(llama_cpp, "__version__", "?"),
           "libraries": _loaded_libraries()})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if "ids" not in req:  # a new question: a cold cache (the parent asks before its clock starts)
                llm.reset()
                llm._ctx.kv_cache_clear()
                _send({"reset": True})
                continue
            t0 = time.perf_counter()
            ids, eos, max_new = req["ids"], set(req["eos"]), int(req["max_new"])
            if req.get("seed") is not None:
                llm.set_seed(int(req["seed"]))
            out, first = [], None
            gen = llm.generate(ids, temp=req["temp"], top_k=req["top_k"], top_p=req["top_p"], min_p=0.0,
                               repeat_penalty=1.0, reset=True)
            for tok in gen:
                if first is None:
                    first = time.perf_counter() - t0
                out.append(int(tok))
                if tok in eos or len(out) >= max_new or len(ids) + len(out) >= llm.n_ctx():
                    break
            gen.close()
            _send({"tokens": out, "first_s": first, "total_s": time.perf_counter() - t0})
        except Exception as e:  # noqa: BLE001
            _send({"error": f"{type(e).__name__}: {e}"})
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
