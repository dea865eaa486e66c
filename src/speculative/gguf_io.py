"""A shipped draft model's GGUF: the target's metadata, tokenizer and token embeddings with the
draft's own decoder layers (``layers.safetensors``, int8 per row, see :mod:`speculative.storage`).

Draft models trained by this project (:mod:`speculative.training.draft_model`, llama architecture)
ship as layers only; :func:`assemble_gguf` writes the complete GGUF into the cache on first use, so
that llama.cpp can load it like any other model. Rotary q/k rows are permuted from Hugging Face's
layout to llama.cpp's; layers are written as F16, norms as F32, the embeddings as the target's
quantized bytes unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .storage import dequantize_rows

#: the shipped draft model's layers, in its folder beside ``drafter.json``
LAYERS_FILE = "layers.safetensors"


def load_layers(folder: Path) -> dict[str, np.ndarray]:
    """The shipped layers of a draft-model folder, de-quantized to float32 (Hugging Face names)."""
    from safetensors.numpy import load_file

    return {name: t.astype(np.float32) for name, t in dequantize_rows(load_file(str(folder / LAYERS_FILE))).items()}


def _permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's rotary layout -> llama.cpp's (interleaved halves per head), for q and k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(layers: dict[str, np.ndarray], target_gguf: str, out_path: Path, n_layers: int, intermediate: int) -> Path:
    """A llama GGUF: the target's metadata, tokenizer and token embeddings, and the draft's layers (F16)."""
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from .cache import atomic_path

    r = GGUFReader(target_gguf)
    arch = r.fields["general.architecture"].contents()
    n_head = int(r.fields[f"{arch}.attention.head_count"].contents())
    n_kv = int(r.fields[f"{arch}.attention.head_count_kv"].contents())
    with atomic_path(out_path) as tmp:
        w = GGUFWriter(str(tmp), arch)
        skip = {"general.architecture", f"{arch}.block_count", f"{arch}.feed_forward_length", "general.file_type",
                "general.name", "general.quantization_version"}
        for name, field in r.fields.items():
            if name.startswith("GGUF.") or name in skip:
                continue
            vtype = field.types[0]
            sub = field.types[1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
            w.add_key_value(name, field.contents(), vtype, sub_type=sub)
        w.add_block_count(n_layers)
        w.add_feed_forward_length(intermediate)
        w.add_name(f"{Path(target_gguf).stem} draft ({n_layers} layers)")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        for t in r.tensors:
            if t.name == "token_embd.weight":
                w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # quantized bytes, unchanged
        for name, arr in layers.items():
            if name == "model.norm.weight":
                w.add_tensor("output_norm.weight", arr.astype(np.float32))
                continue
            if not name.startswith("model.layers."):
                continue
            parts = name.split(".")
            i, rest = int(parts[2]), ".".join(parts[3:])
            if rest not in _HF_TO_GGUF:
                continue
            a = arr
            if rest == "self_attn.q_proj.weight":
                a = _permute_qk(a, n_head)
            elif rest == "self_attn.k_proj.weight":
                a = _permute_qk(a, n_kv)
            a = a.astype(np.float32 if a.ndim == 1 else np.float16)
            w.add_tensor(f"blk.{i}.{_HF_TO_GGUF[rest]}", a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out_path


def assemble_gguf(folder: Path, target_gguf: str) -> Path:
    """The cached GGUF of a shipped draft-model folder (written once per target file)."""
    from .cache import cache_dir, file_key

    meta = json.loads((folder / "drafter.json").read_text())
    out = cache_dir("drafters") / f"{folder.name}-{file_key(folder / LAYERS_FILE)}-{file_key(target_gguf)}.gguf"
    if out.is_file():
        return out
    return write_gguf(load_layers(folder), target_gguf, out, meta["num_hidden_layers"], meta["intermediate_size"])
