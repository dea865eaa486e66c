"""The stock llama-cpp-python peer's worker: one llama-cpp-python ``Llama`` in a process of its own.

Run by :class:`speculative.bench.stock_peer.StockLlamaCppPythonPeer` with the base Python interpreter
in isolated mode (``python -I stock_worker.py --site DIR ...``), so that it imports the llama-cpp-python
installed in ``--site`` (the stock build of ``scripts/build-stock-llama-cpp-python.sh``) and never the
patched one of the project's environment. It imports nothing from ``speculative``.

Protocol, one JSON object per line:

- after loading, on stdout: ``{"ready": true, "llama_cpp": <path of the imported package>, "version": ...}``,
  or ``{"error": "..."}`` and exit 1;
- each request on stdin: ``{"ids": [int, ...], "max_new": int, "temp": float, "top_k": int, "top_p": float,
  "seed": int | null, "eos": [int, ...], "reset": bool}`` (``reset``: a new question, cold cache);
- each answer on stdout: ``{"tokens": [int, ...], "first_s": float | null, "total_s": float}``, the
  seconds from reading the request to the first token and to the last, or ``{"error": "..."}``.

EOF on stdin ends the worker. The generation loop is the in-process peer's
(:class:`speculative.bench.peers.LlamaCppPythonPeer`): the same calls and sampling settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _send(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True, help="the folder holding the llama_cpp package to load")
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--n-ctx", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--lookup", type=int, default=0, help="prompt lookup draft tokens (0: plain decoding)")
    a = ap.parse_args(argv)
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
    _send({"ready": True, "llama_cpp": llama_cpp.__file__, "version": getattr(llama_cpp, "__version__", "?")})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            t0 = time.perf_counter()
            if req.get("reset"):
                llm.reset()
                llm._ctx.kv_cache_clear()
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
