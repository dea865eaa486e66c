"""transformers/PyTorch backend: Hugging Face models (hub id or folder) and GGUF files, on CPU or CUDA.

GGUF files go through transformers' GGUF loader, which de-quantizes every
tensor (18-54 s for the bundled models on 2 cores). The converted weights,
tokenizer and llama.cpp's end-of-generation set are cached once under
``<cache>/hf-converted/`` so later loads take about a second.

KV caches are ``DynamicCache`` objects without sliding-window layers: the
model still masks Gemma 3's sliding window, but every position stays in the
cache, so a rollback (``DynamicCache.crop`` with a negative count) may reach
any position.

Numerics: in fp32 on CPU a position's logits differ by up to ~6e-5 between a
forward of 1 and of 2-8 tokens, so greedy speculation equals plain greedy
except at near-ties; ``batch_invariant`` is False for this backend. On CPU, linear layers may
compute several rows as ``(W @ x.T).T`` where that is measured faster (:mod:`.cpu_linear`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..cache import atomic_path, cache_dir, content_sha256
from ..errors import BackendUnavailableError, ConfigError, ModelLoadError
from ..models import ModelSource
from .base import END_OF_TURN_TEXTS, Backend, ForwardRequest, ForwardResult

_EOG_FILE = "speculative_eog.json"


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the install
        raise BackendUnavailableError(
            "the transformers backend needs PyTorch: `pip install torch==2.13.0` (CPU) or a CUDA build"
        ) from e
    return torch


def _quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass


def _llama_cpp_eog(gguf_path: str) -> list[int]:
    """llama.cpp's end-of-generation ids of a GGUF (vocabulary-only load), so both backends agree."""
    try:
        from . import llama_cpp as lc

        lc._init_library(exact=False)
        L = lc._llama()
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        model = L.llama_model_load_from_file(gguf_path.encode(), mp)
        if not model:
            return []
        try:
            vocab = L.llama_model_get_vocab(model)
            n = L.llama_vocab_n_tokens(vocab)
            return [t for t in range(n) if L.llama_vocab_is_eog(vocab, t)]
        finally:
            L.llama_model_free(model)
    except Exception:  # pragma: no cover - llama.cpp missing: fall back to the tokenizer's ids
        return []


def convert_gguf(gguf_path: str, progress: bool = True) -> Path:
    """De-quantize a GGUF into a cached Hugging Face folder (fp32 safetensors + tokenizer); returns it.

    Raises:
        ModelLoadError: transformers cannot read this GGUF.
    """
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf_path)
    # keyed by content: the same GGUF installed in another environment reuses the conversion
    out = cache_dir("hf-converted") / f"{src.stem}-{content_sha256(src)[:16]}"
    if (out / "config.json").is_file():
        return out
    if progress:
        import sys

        print(f"[speculative] converting {src.name} for transformers (once; cached in {out})", file=sys.stderr)
    try:
        with atomic_path(out) as tmp:
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
            model.hf_quantizer = None  # the de-quantized weights are plain fp32
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            with open(tmp / _EOG_FILE, "w") as f:
                json.dump(_llama_cpp_eog(str(src)), f)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ModelLoadError(f"transformers could not load {src.name}: {e}") from e
    return out


class TransformersBackend(Backend):
    """A Hugging Face causal LM with one ``DynamicCache`` per sequence.

    Args:
        source: a resolved :class:`~speculative.models.ModelSource`.
        device: "cpu", "cuda", "cuda:1", ...; default CUDA when available.
        dtype: "float32", "bfloat16", "float16"; default float32 on CPU, bfloat16 on CUDA.
        n_ctx: positions per sequence (default 4096, capped at the model's maximum).
        n_threads: PyTorch CPU threads (default: PyTorch's choice).
        max_sequences: sequences held at once.
        cpu_linear: on CPU, "auto" (default: ``$SPECULATIVE_CPU_LINEAR`` or "auto"), "transposed" or
            "torch": how linear layers compute several rows (see :mod:`.cpu_linear`; "auto" measures
            once per machine and keeps the faster).

    Raises:
        BackendUnavailableError: torch or transformers missing.
        ModelLoadError: the model cannot be loaded.
    """

    name = "transformers"

    def __init__(
        self,
        source: ModelSource,
        device: str | None = None,
        dtype: str | None = None,
        n_ctx: int | None = 4096,
        n_threads: int | None = None,
        max_sequences: int = 1,
        model_id: str | None = None,
        cpu_linear: str | None = None,
    ):
        super().__init__()
        torch = self._torch = _torch()
        _quiet_transformers()
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:  # pragma: no cover
            raise BackendUnavailableError("the transformers backend needs `pip install transformers`") from e
        if n_threads:
            torch.set_num_threads(int(n_threads))
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailableError("--device cuda asked for, but PyTorch sees no CUDA device")
        dtype = dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.dtype = getattr(torch, dtype)
        self.model_id = model_id or source.name
        self.source = source

        location = source.location
        gguf_eog: list[int] = []
        if source.kind == "gguf":
            folder = convert_gguf(location)
            location = str(folder)
            eog_file = folder / _EOG_FILE
            if eog_file.is_file():
                gguf_eog = json.loads(eog_file.read_text())
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(location)
            self.model = AutoModelForCausalLM.from_pretrained(location, dtype=self.dtype).to(self.device)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"transformers could not load {source.name}: {e}") from e
        self.model.eval()
        self.cpu_linear = "torch"
        if self.device.type == "cpu":
            from .cpu_linear import install

            self.cpu_linear = install(self.model, cpu_linear)
        cfg = self.model.config.get_text_config(decoder=True)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        self.supports_layer_hidden = True
        max_pos = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        n_ctx = int(n_ctx or 4096)
        self.n_ctx = min(n_ctx, max_pos) if max_pos else n_ctx
        self.max_sequences = int(max_sequences)
        self._init_sequences()
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._layer_types = list(getattr(cfg, "layer_types", None) or [])
        self._sliding_window = getattr(cfg, "sliding_window", None)
        self.supports_tree = True
        self.batch_invariant = False
        self.bos_token_id = self.tokenizer.bos_token_id
        self.eos_token_ids = self._end_of_generation_ids(gguf_eog)
        self._caches: dict[int, object] = {}

    def _end_of_generation_ids(self, gguf_eog: Sequence[int]) -> frozenset[int]:
        ids: set[int] = set(int(t) for t in gguf_eog)
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(t) for t in eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TEXTS if t in vocab)
        return frozenset(i for i in ids if 0 <= i < self.vocab_size)

    def non_embedding_parameters(self) -> int:
        skip = {id(self.model.get_input_embeddings().weight), id(self.model.get_output_embeddings().weight)}
        return int(sum(p.numel() for p in self.model.parameters() if id(p) not in skip))

    def _cost_identity(self) -> str:
        threads = self._torch.get_num_threads()
        return f"{self.source.location}|{self.device}|{self.dtype}|threads={threads}|linear={self.cpu_linear}"

    # ---- caches --------------------------------------------------------------------

    def _cache(self, seq_id: int):
        c = self._caches.get(seq_id)
        if c is None:
            from transformers import DynamicCache

            c = self._caches[seq_id] = DynamicCache()  # no config: full layers, rollback anywhere
        return c

    def _truncate_cache(self, seq_id: int, n_tokens: int) -> None:
        if n_tokens == 0:
            self._caches.pop(seq_id, None)
            return
        c = self._cache(seq_id)
        drop = c.get_seq_length() - n_tokens
        if drop > 0:
            c.crop(-drop)

    def _commit_tree(self, seq_id: int, base: int, tokens, parents, path) -> int:
        torch = self._torch
        keep = torch.tensor(list(range(base)) + [base + i for i in path], dtype=torch.long, device=self.device)
        for layer in self._cache(seq_id).layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(-2, keep)
                layer.values = layer.values.index_select(-2, keep)
        return len(path)

    def _project(self, h):
        logits = self.model.get_output_embeddings()(h)
        if self._softcap:
            logits = self._torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def _tree_masks(self, start: int, parents: Sequence[int]):
        """4-D additive masks for a tree after ``start`` cached tokens, and depth-based position ids.

        Models with sliding-window layers (Gemma 3) get one mask per layer type.
        """
        torch = self._torch
        from ..trees import ancestor_matrix, depths

        n = len(parents)
        # ancestor_matrix counts a virtual root; drop it: token i is row/col i+1
        allowed_new = torch.from_numpy(ancestor_matrix([p for p in parents])[1:, 1:])
        pos = torch.tensor([start + d - 1 for d in depths(parents)], dtype=torch.long)
        allowed = torch.cat([torch.ones((n, start), dtype=torch.bool), allowed_new], dim=1)
        neg = torch.finfo(self.dtype).min

        def to_mask(a):
            m = torch.zeros(a.shape, dtype=self.dtype)
            m.masked_fill_(~a, neg)
            return m[None, None].to(self.device)

        full = to_mask(allowed)
        if self._sliding_window and self._layer_types:
            key_pos = torch.cat([torch.arange(start), pos])
            within = key_pos[None, :] > pos[:, None] - self._sliding_window
            masks = {t: full for t in set(self._layer_types)}
            masks["sliding_attention"] = to_mask(allowed & within)
            return masks, pos.unsqueeze(0).to(self.device)
        return full, pos.unsqueeze(0).to(self.device)

    def _forward(self, requests: Sequence[ForwardRequest]) -> list[ForwardResult]:
        torch = self._torch
        results = []
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        with torch.inference_mode():
            for r in requests:
                start = len(self._seqs[r.seq_id].tokens)
                n = len(r.tokens)
                ids = torch.tensor([list(r.tokens)], dtype=torch.long, device=self.device)
                layers = r.hidden_layers if r.hidden else None
                extra = {"output_hidden_states": True} if layers else {}
                if r.tree_parents is not None:
                    mask, pos = self._tree_masks(start, r.tree_parents)
                    out = base(input_ids=ids, position_ids=pos, attention_mask=mask, cache=self._cache(r.seq_id),
                               use_cache=True, **extra)
                else:
                    pos = torch.arange(start, start + n, device=self.device).unsqueeze(0)
                    out = base(input_ids=ids, position_ids=pos, cache=self._cache(r.seq_id), use_cache=True, **extra)
                rows = r.output_rows()
                h = out.last_hidden_state[0, rows]
                logits = self._project(h).float().cpu().numpy() if rows else np.zeros((0, self.vocab_size), np.float32)
                if layers:
                    h = torch.cat([out.hidden_states[i][0, rows] for i in layers], dim=-1)
                hidden = h.float().cpu().numpy() if r.hidden else None
                results.append(ForwardResult(logits, hidden))
        return results

    # ---- tokenizer ---------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=add_special).input_ids)
        if add_special and self.bos_token_id is not None and len(ids) >= 2 and ids[0] == ids[1] == self.bos_token_id:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        t = self.tokenizer.convert_ids_to_tokens(int(token_id))
        return t if isinstance(t, str) else ""

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        if not self.chat_template:
            raise ConfigError(f"{self.model_id} has no chat template; use --no-chat")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return self.encode(text, add_special=True)

    def close(self) -> None:
        self._caches.clear()
