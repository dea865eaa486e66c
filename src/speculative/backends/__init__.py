"""Backends: where the target (and a draft model) run.

``llama.cpp`` (GGUF files, the CPU default) and ``transformers`` (Hugging Face
models and GGUF through transformers' loader, CPU or CUDA) implement one
interface, :class:`~speculative.backends.base.Backend`.
"""

from __future__ import annotations

from ..errors import ConfigError, ModelLoadError
from ..models import ModelSource, resolve
from .base import Backend, ForwardRequest, ForwardResult

BACKENDS = ("llama.cpp", "transformers")
DEFAULT_BACKEND = "llama.cpp"


def load_backend(
    model: str | ModelSource,
    backend: str = DEFAULT_BACKEND,
    *,
    n_ctx: int | None = 4096,
    n_threads: int | None = None,
    max_sequences: int = 1,
    numerics: str = "exact",
    device: str | None = None,
    dtype: str | None = None,
    check_numerics: bool = True,
    tree_width: int = 0,
) -> Backend:
    """Load ``model`` (a spec or a resolved source) on ``backend``.

    Args:
        model: registered name, GGUF path, HF folder or HF id (see :mod:`speculative.models`).
        backend: "llama.cpp" or "transformers".
        n_ctx: positions per sequence.
        n_threads: CPU threads.
        max_sequences: sequences held at once.
        numerics: llama.cpp only: "exact" (default) or "fast" (lossless up to kernel numerics).
        device, dtype: transformers only.
        check_numerics: llama.cpp only: check (once per build and model, cached) that batched
            and single-token logits are identical, and warn if not.
        tree_width: llama.cpp only: most leaves of the token trees this context verifies
            (0: chains only; transformers always verifies trees).

    Raises:
        ConfigError, ModelNotFoundError, ModelLoadError, BackendUnavailableError.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend '{backend}': choose one of {', '.join(BACKENDS)}")
    src = model if isinstance(model, ModelSource) else resolve(model)
    if n_ctx is not None and n_ctx < 0:
        raise ConfigError(f"ctx-size must be >= 0, got {n_ctx}")
    if backend == "llama.cpp":
        if src.kind != "gguf":
            raise ModelLoadError(
                f"the llama.cpp backend needs a GGUF file, and '{src.name}' is a Hugging Face "
                f"{'id' if src.kind == 'hf-hub' else 'folder'}: use --backend transformers"
            )
        from .llama_cpp import LlamaCppBackend

        b = LlamaCppBackend(
            src.location,
            n_ctx=n_ctx or 0,
            n_threads=n_threads,
            max_sequences=max_sequences,
            numerics=numerics,
            model_id=src.name,
            tree_width=tree_width,
        )
        if check_numerics and numerics == "exact":
            from ..numerics import ensure_batch_invariance

            ensure_batch_invariance(b)
        return b
    from .transformers import TransformersBackend

    return TransformersBackend(
        src, device=device, dtype=dtype, n_ctx=n_ctx, n_threads=n_threads, max_sequences=max_sequences
    )


__all__ = ["Backend", "ForwardRequest", "ForwardResult", "load_backend", "BACKENDS", "DEFAULT_BACKEND"]
