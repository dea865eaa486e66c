"""speculative: lossless speculative decoding (llama.cpp and transformers backends).

Quick start::

    from speculative import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained("smollm2-135m-instruct", drafter="ngram")
    result = gen.generate("Summarize: speculative decoding ...", max_new_tokens=64)
    print(result.text, result.stats.summary())
    for piece in gen.stream("Tell me a story."):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

from .config import GenerationConfig, SamplingParams
from .constraints import ConstraintSpec
from .engine import SpeculativeGenerator
from .errors import SpeculativeError
from .output import Generation, GenerationResult
from .stats import GenerationStats

__version__ = "0.1.0"

__all__ = [
    "ConstraintSpec",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "Generation",
    "SamplingParams",
    "SpeculativeError",
    "SpeculativeGenerator",
    "__version__",
]
