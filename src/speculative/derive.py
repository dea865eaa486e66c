"""Derive a cheaper same-vocabulary draft model from a target GGUF.

Two knobs, both through llama.cpp's quantize API (``llama_model_quantize``):
re-quantization to fewer bits, and pruning of transformer blocks
(``prune_layers``; the remaining blocks are renumbered). Untrained, such a
drafter is a weak match for its target; it is useful as a baseline, for
testing rejections, and as the starting point of a trained drafter.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .cache import atomic_path
from .errors import ConfigError, ModelLoadError
from .models import resolve

QUANT_TYPES = ("Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")


def block_count(gguf_path: str | os.PathLike) -> int:
    """Number of transformer blocks, from the GGUF metadata (``<arch>.block_count``)."""
    from gguf import GGUFReader

    r = GGUFReader(str(gguf_path))
    arch = r.fields["general.architecture"].contents()
    return int(r.fields[f"{arch}.block_count"].contents())


def spread_layers(n_layers: int, n_drop: int) -> list[int]:
    """``n_drop`` block indices to prune, spread evenly, never the first or the last block."""
    if n_drop <= 0:
        return []
    if n_drop > n_layers - 2:
        raise ConfigError(f"can drop at most {n_layers - 2} of {n_layers} layers (the first and last stay)")
    inner = list(range(1, n_layers - 1))
    step = len(inner) / n_drop
    return sorted({inner[int(i * step + step / 2)] for i in range(n_drop)})


def derive_drafter(
    target: str,
    output: str | os.PathLike,
    quant: str = "Q4_0",
    drop_layers: int = 0,
    n_threads: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a draft GGUF derived from ``target``.

    Args:
        target: model spec of a GGUF target.
        output: path of the new GGUF (written atomically).
        quant: one of :data:`QUANT_TYPES`.
        drop_layers: how many transformer blocks to prune.

    Returns:
        The output path.

    Raises:
        ConfigError: bad type or layer count, or output exists (without ``overwrite``).
        ModelLoadError: llama.cpp failed.
    """
    quant = quant.upper()
    if quant not in QUANT_TYPES:
        raise ConfigError(f"unknown quantization '{quant}': choose one of {', '.join(QUANT_TYPES)}")
    src = resolve(target)
    if src.kind != "gguf":
        raise ConfigError("make-drafter needs a GGUF target")
    out = Path(output)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --force to replace it")
    n_layers = block_count(src.location)
    prune = spread_layers(n_layers, drop_layers)

    from .backends.llama_cpp import _init_library, _llama

    _init_library(exact=False)
    L = _llama()
    params = L.llama_model_quantize_default_params()
    params.nthread = int(n_threads or 0)
    params.ftype = getattr(L, f"LLAMA_FTYPE_MOSTLY_{quant}")
    params.allow_requantize = True
    params.quantize_output_tensor = True
    keep = None
    if prune:
        keep = (ctypes.c_int32 * (len(prune) + 1))(*prune, -1)
        params.prune_layers = ctypes.cast(keep, ctypes.POINTER(ctypes.c_int32))
    with atomic_path(out) as tmp:
        rc = L.llama_model_quantize(str(src.location).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise ModelLoadError(f"llama.cpp could not derive a drafter from {src.name} (status {rc})")
    del keep
    return out
