"""The drafter interface: one proposer per method, the engine stays the same.

A drafter proposes up to ``max_tokens`` next tokens given the committed
context. It keeps whatever per-request state it needs (a KV cache, an n-gram
index) in a :class:`DraftState` that the engine creates with
:meth:`Drafter.start` and frees with :meth:`Drafter.finish`, so one drafter
serves several concurrent requests.

Every proposal reports the distribution each token was drawn from (``probs``,
after the request's logits processing), or None when proposals are
deterministic (n-gram lookup: q is one-hot). Verification is the engine's job.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend
from ..sampling import Sampler


@dataclass
class DraftProposal:
    """Draft tokens x_1..x_m and the distributions q_1..q_m they were drawn from.

    Attributes:
        tokens: the m proposed ids (m may be 0: a plain decoding step).
        probs: float64 ``[m, V]`` processed draft distributions, or None for a
            deterministic proposal (q_i = one-hot(x_i)) or under greedy decoding.
    """

    tokens: list[int] = field(default_factory=list)
    probs: np.ndarray | None = None


@dataclass
class DraftState:
    """Per-request drafter state; subclasses add fields."""

    prompt_len: int = 0


@dataclass
class BuildContext:
    """What a drafter factory may need to know about the run.

    Attributes:
        backend: the target's backend name ("llama.cpp" or "transformers").
        n_threads, numerics, device, dtype, n_ctx, max_sequences: load options of the target,
            reused for a draft model unless the spec overrides them.
    """

    backend: str = "llama.cpp"
    n_threads: int | None = None
    numerics: str = "exact"
    device: str | None = None
    dtype: str | None = None
    n_ctx: int | None = 4096
    max_sequences: int = 1


class Drafter(abc.ABC):
    """Base class of drafters. Subclasses implement :meth:`propose`."""

    #: the spec TYPE word this drafter registers under
    kind: str = "drafter"

    def __init__(self) -> None:
        self.target: Backend | None = None

    @property
    def description(self) -> str:
        return self.kind

    def bind(self, target: Backend) -> None:
        """Attach to the target once, checking compatibility (vocabulary, ...).

        Raises:
            VocabularyMismatchError: a draft model with another vocabulary.
        """
        self.target = target

    def start(self, prompt: Sequence[int]) -> DraftState:
        """New request with ``prompt`` token ids. May pre-compute (counted as prefill time)."""
        return DraftState(prompt_len=len(prompt))

    @abc.abstractmethod
    def propose(
        self,
        state: DraftState,
        context: Sequence[int],
        max_tokens: int,
        sampler: Sampler,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """Propose up to ``max_tokens`` (>= 1) tokens following ``context`` (prompt + committed output)."""

    def finish(self, state: DraftState) -> None:
        """The request ended; free its state."""

    def close(self) -> None:
        """Free models and caches."""


class NoDrafter(Drafter):
    """``none``: propose nothing, so every step is a plain autoregressive step (the baseline)."""

    kind = "none"

    def propose(self, state, context, max_tokens, sampler, rng) -> DraftProposal:
        return DraftProposal()
