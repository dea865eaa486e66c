"""Generation settings, validated once at the edge.

:class:`SamplingParams` holds the logits processing shared by the target's p and
the drafter's q; :class:`GenerationConfig` adds the decoding-loop settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .constraints import ConstraintSpec
from .errors import ConfigError

#: Default number of draft tokens per step (k). Chosen on the development
#: prompt set (``src/speculative/data/devset.jsonl``), never on Spec-Bench:
#: with the adaptive policy, k = 8 and k = 16 were within noise, and the
#: smaller bounds the cost of a wasted verification.
DEFAULT_NUM_SPECULATIVE_TOKENS = 8

DRAFT_POLICIES = ("adaptive", "fixed")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing applied identically to target (p) and drafter (q).

    Order (as vLLM): logit bias, then penalties (repetition on prompt and output,
    frequency and presence on the output), then temperature, top-k, top-p and
    min-p. History-dependent steps (penalties) see, at each position, exactly
    the tokens that token-by-token decoding would have seen there.

    Attributes:
        temperature: 0 means greedy (argmax, ties to the lowest id); > 0 samples.
        top_k: keep the k most likely tokens; 0 disables.
        top_p: nucleus mass in (0, 1]; 1.0 disables.
        min_p: drop tokens whose probability is below min_p times the largest; 0 disables.
        seed: seed of the request's random generator; None draws fresh entropy.
        presence_penalty: subtracted from the logit of every token already generated (OpenAI, [-2, 2]).
        frequency_penalty: subtracted once per earlier occurrence in the output (OpenAI, [-2, 2]).
        repetition_penalty: CTRL-style (Keskar et al. 2019) on prompt and output tokens: positive
            logits divided by it, negative ones multiplied; 1.0 disables; in [0.01, 10].
        logit_bias: token id -> bias added to its logit ([-100, 100], OpenAI).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_history(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias)

    def validate(self) -> SamplingParams:
        """Return self, or raise :class:`ConfigError` naming the bad setting."""
        if not _is_number(self.temperature) or self.temperature < 0 or math.isinf(self.temperature):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 disables), got {self.top_k!r}")
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not (0.0 <= self.min_p <= 1.0):
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not (-2.0 <= v <= 2.0):
                raise ConfigError(f"{name} must be in [-2, 2], got {v!r}")
        if not _is_number(self.repetition_penalty) or not (0.01 <= self.repetition_penalty <= 10.0):
            # below 0.01 a penalized logit overflows float32 (a 1.6e-175 penalty made every logit inf)
            raise ConfigError(f"repetition_penalty must be in [0.01, 10], got {self.repetition_penalty!r}")
        if self.logit_bias:
            for tok, bias in self.logit_bias.items():
                if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                    raise ConfigError(f"logit_bias keys must be token ids >= 0, got {tok!r}")
                if not _is_number(bias) or not (-100.0 <= bias <= 100.0):
                    raise ConfigError(f"logit_bias values must be in [-100, 100], got {bias!r}")
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
        speculative: False decodes without drafting (a per-request switch).
        stop: strings that end the output; the text stops before the first one
            completed, the token ids and log-probabilities at the token completing it.
        logprobs: None, or how many top alternatives to report with each token's
            log-probability (0: the emitted token's only; at most 20).
        min_tokens: end-of-generation tokens cannot be generated before this many
            tokens (their logits are masked at every earlier position, verified draft
            positions included), and stop strings count only once the output has this
            many tokens (vLLM's ``min_tokens``). 0 disables.
        constraint: None, or a :class:`~speculative.constraints.ConstraintSpec` the output must match
            (JSON object, JSON Schema, regular expression, Lark/GBNF grammar); ``with_`` also takes
            ``json_schema=``, ``regex=``, ``grammar=`` or ``json_object=True``.
        tenant: whose request it is (the server sets it from the API key and the ``user`` field). The
            generator keeps one draft policy per tenant, the suffix drafter its earlier requests and model
            drafters their acceptance calibration, so that no request's drafts, acceptance or timing depend
            on another tenant's text. "" by default.
    """

    max_new_tokens: int = 128
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_at_eos: bool = True
    draft_policy: str = "adaptive"
    speculative: bool = True
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    min_tokens: int = 0
    constraint: ConstraintSpec | None = None
    tenant: str = ""

    def validate(self) -> GenerationConfig:
        """Return self, or raise :class:`ConfigError` naming the bad setting."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"num_speculative_tokens (k) must be an integer >= 1, got {k!r}")
        if k > 64:
            raise ConfigError(f"num_speculative_tokens (k) must be at most 64, got {k}")
        if self.draft_policy not in DRAFT_POLICIES:
            raise ConfigError(f"draft_policy must be one of {', '.join(DRAFT_POLICIES)}, got {self.draft_policy!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty strings")
        if len(self.stop) > 16:
            raise ConfigError("at most 16 stop strings")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20
        ):
            raise ConfigError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.constraint is not None:
            if not isinstance(self.constraint, ConstraintSpec):
                raise ConfigError(f"constraint must be a ConstraintSpec, got {type(self.constraint).__name__}")
            self.constraint.validate()
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(f"min_tokens must be an integer >= 0, got {m!r}")
        if m > self.max_new_tokens:
            raise ConfigError(f"min_tokens ({m}) must not exceed max_new_tokens ({self.max_new_tokens})")
        self.sampling.validate()
        return self

    def with_(self, **changes) -> GenerationConfig:
        """A copy with some fields changed (sampling fields may be given directly)."""
        keys = {k: changes.pop(k) for k in ("json_schema", "regex", "grammar", "json_object") if k in changes}
        if keys:
            from .constraints import spec_from_options

            spec = spec_from_options(**keys)
            if spec is not None:
                if changes.get("constraint") is not None:
                    raise ConfigError("give either constraint or one of json_schema, regex, grammar, json_object")
                changes["constraint"] = spec
        sampling_fields = set(SamplingParams.__dataclass_fields__)
        s = {k: changes.pop(k) for k in list(changes) if k in sampling_fields}
        if "stop" in changes and changes["stop"] is not None:
            st = changes["stop"]
            if not isinstance(st, (str, list, tuple)):
                raise ConfigError(f"stop must be a string or a list of strings, got {type(st).__name__}")
            changes["stop"] = (st,) if isinstance(st, str) else tuple(st)
        unknown = sorted(set(changes) - set(self.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"unknown generation option {unknown[0]!r}")
        cfg = replace(self, **changes)
        if s:
            cfg = replace(cfg, sampling=replace(cfg.sampling, **s))
        return cfg
