"""The int8 per-row storage of shipped drafter weights (heads and draft-model layers, safetensors).

A 2-D float weight W [rows, cols] is stored as ``NAME.int8`` (int8 [rows, cols]) and ``NAME.scale``
(float32 [rows, 1], max |W[r]| / 127), symmetric per row; smaller or 1-D tensors are stored as
float32 under their own name. Writing is training's and the importer's job, reading inference's.
"""

from __future__ import annotations

import numpy as np


def int8_rows(t, min_numel: int = 0) -> dict:
    """Symmetric int8 per-row quantization of a 2-D float tensor ``t`` [rows, cols]:
    ``{".int8": int8 [rows, cols], ".scale": float32 [rows, 1]}`` (suffixes to append to the weight's
    name); tensors that are not 2-D or smaller than ``min_numel`` come back as ``{"": float32}``."""
    import torch

    t = t.detach().float().cpu().contiguous()
    if t.ndim != 2 or t.numel() < min_numel:
        return {"": t}
    scale = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return {".int8": torch.round(t / scale).to(torch.int8).contiguous(), ".scale": scale.contiguous()}


def dequantize_rows(raw: dict) -> dict:
    """The float weights of a loaded safetensors dict written with :func:`int8_rows`: each
    ``NAME.int8`` times ``NAME.scale`` becomes ``NAME`` (float32), other entries are kept as they are.
    Works on numpy arrays (``safetensors.numpy``) and torch tensors (``safetensors.torch``) alike."""
    out = {}
    for name, t in raw.items():
        if name.endswith(".int8"):
            base = name[: -len(".int8")]
            out[base] = (t.float() if hasattr(t, "float") else t.astype(np.float32)) * raw[base + ".scale"]
        elif not name.endswith(".scale"):
            out[name] = t
    return out
