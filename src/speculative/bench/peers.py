"""Peers measured in the same bench run: llama-cpp-python (plain and its prompt lookup; our build
in this process, the stock build in a subprocess: :mod:`.stock_peer`),
transformers ``generate`` (plain, prompt lookup, assisted), any OpenAI-compatible endpoint,
and llama.cpp's own ``llama-server`` (plain and speculative; :mod:`.llama_server`).

Each runs with its own defaults, as its users would, from the same prompt
token ids as our methods. They are not gated on greedy identity: the report
gives the fraction of questions whose output matches the baseline's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..backends.base import Backend
from ..config import GenerationConfig
from ..errors import BackendUnavailableError, ConfigError
from .datasets import Question
from .methods import Method, RunRecord, _TimedTurns

PEER_NAMES = (
    "llama-cpp-python",
    "llama-cpp-python-lookup",
    "llama-cpp-python-stock",
    "llama-cpp-python-stock-lookup",
    "transformers",
    "transformers-lookup",
    "transformers-assisted:MODEL",
    "llama-server",
    "llama-server-spec",
    "llama-server-spec-defaults",
    "llama-server-ngram",
    "llama-server-ngram-mod",
)


class LlamaCppPythonPeer(Method):
    """llama-cpp-python's high-level ``Llama`` (llama.cpp's default kernels, repacked weights), optionally with
    ``LlamaPromptLookupDecoding``.

    It runs in this process, so it loads the llama-cpp-python that this package runs on: our build, with the
    batch-invariant patch compiled in (its weights load into llama.cpp's own repacked buffers, but the patch's
    F16 attention path and build options are ours). Its label says so ("ours"), and it is never the
    "fastest unmodified plain decoder" that headline ratios are taken against: that is ``llama-server``,
    from llama.cpp's default build (:mod:`.llama_server`), or the stock llama-cpp-python in a subprocess
    (:mod:`.stock_peer`). It runs with this process's ``GGML_CPU_TILED_MM=0`` (set by our backend for exact
    numerics), which switches off llama.cpp's tiled K-quant matmul in its build too.
    """

    kind = "peer"
    unmodified = False

    def __init__(self, gguf_path: str, target: Backend, chat: bool, lookup: bool, n_ctx: int, n_threads: int):
        import llama_cpp

        self.label = "llama-cpp-python" + (" lookup" if lookup else "") + " (our build)"
        self.plain = not lookup
        kwargs = dict(model_path=gguf_path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=10)
            kwargs["logits_all"] = True  # llama-cpp-python 0.3.36 sizes its score buffer by this flag alone
        self.llm = llama_cpp.Llama(**kwargs)
        self.turns = _TimedTurns(target, chat)
        self.eos = target.eos_token_ids

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        s = cfg.sampling

        def turn(ids):
            out, first_at = [], None
            if s.seed is not None:
                self.llm.set_seed(s.seed)
            gen = self.llm.generate(
                ids, temp=s.temperature, top_k=s.top_k if s.top_k else (1 if s.greedy else 0), top_p=s.top_p,
                min_p=0.0, repeat_penalty=1.0, reset=True,
            )
            for tok in gen:
                if first_at is None:
                    first_at = time.perf_counter()
                out.append(int(tok))
                if tok in self.eos or len(out) >= cfg.max_new_tokens or len(ids) + len(out) >= self.llm.n_ctx():
                    break
            gen.close()
            return out, first_at, None, None

        # cold start per question; later turns reuse the prefix, as llama-cpp-python does by itself
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()
        return self.turns.run_turns(question, turn)

    def close(self) -> None:
        self.llm.close()


class TransformersPeer(Method):
    """transformers ``model.generate``: plain, prompt lookup (``prompt_lookup_num_tokens``) or assisted."""

    kind = "peer"

    def __init__(self, hf_backend, target: Backend, chat: bool, mode: str, assistant=None):
        self.hf = hf_backend
        self.mode = mode
        self.assistant = assistant
        self.unmodified = True  # PyTorch's and transformers' own code
        self.label = {"plain": "transformers", "lookup": "transformers lookup"}.get(mode, f"transformers assisted ({mode})")
        self.plain = mode == "plain"
        self.turns = _TimedTurns(target, chat)
        self.eos = sorted(target.eos_token_ids)

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        s = cfg.sampling

        class FirstToken(StoppingCriteria):
            first_at = None

            def __call__(self, input_ids, scores, **kwargs):
                if FirstToken.first_at is None:
                    FirstToken.first_at = time.perf_counter()
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        def turn(ids):
            FirstToken.first_at = None
            inp = torch.tensor([ids], device=self.hf.device)
            kw = dict(
                max_new_tokens=cfg.max_new_tokens,
                eos_token_id=self.eos,
                pad_token_id=self.eos[0],
                stopping_criteria=StoppingCriteriaList([FirstToken()]),
                do_sample=not s.greedy,
            )
            if not s.greedy:
                kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
                if s.seed is not None:
                    torch.manual_seed(s.seed)
            if self.mode == "lookup":
                kw["prompt_lookup_num_tokens"] = 10
            elif self.assistant is not None:
                kw["assistant_model"] = self.assistant
            with torch.inference_mode():
                out = self.hf.model.generate(inp, attention_mask=torch.ones_like(inp), **kw)
            return out[0, len(ids) :].tolist(), FirstToken.first_at, None, None

        return self.turns.run_turns(question, turn)


class EndpointPeer(Method):
    """Any OpenAI-compatible server (``/v1/completions``), timed from the client, streamed."""

    kind = "peer"
    compare_by = "text"

    def __init__(self, url: str, target: Backend, chat: bool, model: str | None = None):
        try:
            import openai
        except ImportError as e:  # pragma: no cover
            raise BackendUnavailableError("--endpoint needs the openai package (pip install openai)") from e
        base = url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        self.client = openai.OpenAI(base_url=base, api_key="none", timeout=600)
        self.model = model or self._first_model()
        self.label = f"endpoint {url}"
        self.turns = _TimedTurns(target, chat)

    def _first_model(self) -> str:
        try:
            models = self.client.models.list().data
        except Exception as e:
            raise ConfigError(f"endpoint not reachable: {e}") from None
        return models[0].id if models else "default"

    def run(self, question: Question, cfg: GenerationConfig) -> RunRecord:
        s = cfg.sampling

        def turn(ids: Sequence[int]):
            first_at, text, n = None, "", 0
            stream = self.client.completions.create(
                model=self.model, prompt=list(ids), max_tokens=cfg.max_new_tokens, temperature=s.temperature,
                top_p=s.top_p, stream=True, stream_options={"include_usage": True},
                **({"seed": s.seed} if s.seed is not None else {}),
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    if first_at is None:
                        first_at = time.perf_counter()
                    text += chunk.choices[0].text
                if getattr(chunk, "usage", None):
                    n = chunk.usage.completion_tokens
            return None, first_at, text, n or len(self.turns.target.encode(text, add_special=False))

        return self.turns.run_turns(question, turn)
