"""``speculative bench`` and ``speculative profile``: the measuring instruments.

:mod:`.datasets` (Spec-Bench and the development prompts), :mod:`.methods`
(our decoders), :mod:`.peers` (llama-cpp-python, transformers, endpoints),
:mod:`.runner` (interleaved, resumable runs) and :mod:`.report` (tables, plots).
"""

from .runner import BenchConfig, BenchRunner

__all__ = ["BenchConfig", "BenchRunner"]
