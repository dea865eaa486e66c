"""Generation settings, validated once at the edge.

:class:`SamplingParams` holds the logits processing shared by the target's p and
the drafter's q; :class:`GenerationConfig` adds the decoding-loop settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .errors import ConfigError

#: Default number of draft tokens per step (k). Chosen on the development
#: prompt set (``speculative.devset``), never on Spec-Bench.
DEFAULT_NUM_SPECULATIVE_TOKENS = 8

DRAFT_POLICIES = ("adaptive", "fixed")


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing applied identically to target (p) and drafter (q).

    Order (as in Hugging Face ``generate``): divide logits by ``temperature``,
    keep the ``top_k`` largest, keep the smallest set whose probability mass
    reaches ``top_p``, renormalize.

    Attributes:
        temperature: 0 means greedy (argmax, ties to the lowest id); > 0 samples.
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        seed: seed of the request's random generator; None draws fresh entropy.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Return self, or raise :class:`ConfigError` naming the bad setting."""
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature):
            raise ConfigError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if self.temperature < 0 or math.isinf(self.temperature):
            raise ConfigError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 disables), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        return self


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of one generation.

    Attributes:
        max_new_tokens: upper bound on generated tokens (>= 1). Output never exceeds it.
        num_speculative_tokens: k, the most draft tokens verified per step (>= 1).
            A drafter may propose fewer (down to 0, a plain decoding step).
        sampling: see :class:`SamplingParams`.
        stop_at_eos: end right after the first end-of-generation token.
        draft_policy: "adaptive" (verify only the draft tokens worth their verification
            cost, by the cost model and the drafter's confidence) or "fixed" (verify every
            proposed token, up to k).
    """

    max_new_tokens: int = 128
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_at_eos: bool = True
    draft_policy: str = "adaptive"

    def validate(self) -> GenerationConfig:
        """Return self, or raise :class:`ConfigError` naming the bad setting."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"num_speculative_tokens (k) must be an integer >= 1, got {k!r}")
        if self.draft_policy not in DRAFT_POLICIES:
            raise ConfigError(f"draft_policy must be one of {', '.join(DRAFT_POLICIES)}, got {self.draft_policy!r}")
        self.sampling.validate()
        return self

    def with_(self, **changes) -> GenerationConfig:
        """A copy with some fields changed (sampling fields may be given directly)."""
        sampling_fields = {"temperature", "top_k", "top_p", "seed"}
        s = {k: changes.pop(k) for k in list(changes) if k in sampling_fields}
        cfg = replace(self, **changes)
        if s:
            cfg = replace(cfg, sampling=replace(cfg.sampling, **s))
        return cfg
