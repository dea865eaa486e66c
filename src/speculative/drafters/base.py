"""The drafter interface: one proposer per method; the request, the policy and verification stay the same.

A drafter proposes up to ``max_tokens`` next tokens given the committed context, and is told what
was committed (the context of its next proposal, and for drafters that read them the target's
hidden states of the committed tokens). It keeps whatever per-request state it needs (a KV cache,
an n-gram index) in a :class:`DraftState` made by :meth:`Drafter.start` and freed by
:meth:`Drafter.finish`, so one drafter serves several concurrent requests.

Every proposal reports the distribution each token was drawn from (``probs``, after the request's
logits processing), or None when proposals are deterministic (n-gram lookup: q is one-hot).
Verification is the request's job (:mod:`speculative.request`); when to draft and how much of a
draft to verify is the policy's (:mod:`speculative.policy`), which also keeps what a drafter costs
and how often it is accepted. A drafter is just a proposer.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..backends.base import Backend, ForwardRequest
from ..sampling import Sampler
from .calibration import TenantCalibrations

if TYPE_CHECKING:
    from ..constraints import DraftGuide

#: what a head's layers may run in on the CPU (drafter.json ``extra.inference_precision``, the ``precision=`` option)
HEAD_PRECISIONS = ("int8", "fp32")


@dataclass
class DraftProposal:
    """Draft tokens x_1..x_m (a chain, or a token tree) and the distributions they were drawn from.

    Attributes:
        tokens: the m proposed ids (m may be 0: a plain decoding step).
        probs: float64 ``[m, V]``: row i is the processed distribution token i was
            drawn from (for a tree, i.i.d. siblings share their parent's row); None
            for deterministic proposals (one-hot q: n-gram matches, top-k
            candidates) or under greedy decoding.
        confidence: per token, the drafter's estimate of P(token i is accepted |
            its parent was), which the adaptive draft policy weighs against
            verification cost; None when the drafter has no estimate (verify all).
        parents: None for a chain; for a token tree, each token's parent index
            (-1: the last committed token), parents before children, siblings in
            order of preference (see :mod:`speculative.trees`).
        catchup_s: seconds of this proposal spent bringing the drafter up to the context (a draft
            model's lazy prompt prefill), not drafting: left out of the per-token draft cost.
        catchup_tokens: how many tokens that catch-up fed (the policy measures its rate from both).
        source: which drafter proposed it, where one drafter combines several (``suffix+OTHER``):
            counted per step in the request's statistics (``drafter_steps``); "" otherwise.
    """

    tokens: list[int] = field(default_factory=list)
    probs: np.ndarray | None = None
    confidence: list[float] | None = None
    parents: list[int] | None = None
    catchup_s: float = 0.0
    catchup_tokens: int = 0
    source: str = ""


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
    """Base class of drafters: :meth:`propose`, and the lifecycle of a request around it
    (:meth:`start`, :meth:`observe_hidden`, :meth:`finish`)."""

    #: the spec TYPE word this drafter registers under
    kind: str = "drafter"
    #: True for drafters that read the target's hidden states (EAGLE, Medusa):
    #: the request then asks the target for them and calls :meth:`observe_hidden`
    needs_hidden: bool = False
    #: how many trailing prompt positions' hidden states :meth:`observe_hidden` gets at prefill
    hidden_window: int = 0
    #: None: the target's final hidden states; else the layers whose hidden states (concatenated)
    #: the drafter reads (see ``ForwardRequest.hidden_layers``)
    hidden_layers: tuple[int, ...] | None = None
    #: True for drafters that honour ``guide=`` in :meth:`propose` (they propose only tokens the
    #: output constraint allows, and report as ``probs`` the masked distribution they sampled from);
    #: the request passes ``guide=None`` to the others and cuts their drafts itself
    steerable: bool = False
    #: True for drafters that run a network for every proposal (draft models, heads): the policy backs
    #: off from one whose proposals are not worth verifying (:class:`~speculative.policy.DraftPolicy`)
    runs_network: bool = False
    #: the draft model this drafter runs on a backend of its own, if any: the policy reads its
    #: measured T(1) as the prior of the drafter's cost, the statistics its forward time
    model: Backend | None = None

    def __init__(self) -> None:
        self.target: Backend | None = None

    @property
    def description(self) -> str:
        return self.kind

    def non_embedding_parameters(self) -> int | None:
        """The drafter's own parameters outside token embeddings and output head (None: no model)."""
        return None

    def bind(self, target: Backend) -> None:
        """Attach to the target once, checking compatibility (vocabulary, ...).

        Raises:
            VocabularyMismatchError: a draft model with another vocabulary.
        """
        self.target = target

    def warm_up(self) -> None:
        """Run the drafter once on made-up input after :meth:`bind`, so that what a first call costs once per
        process (PyTorch's thread pool, lazily packed int8 weights, allocations) is paid at load and not in the
        first request's first proposal, where the draft policy would count it as the drafter's cost and could
        silence it (a replay of the Qwen gate v18's first question: one head call took 233 ms against 3-6 ms;
        docs/policy.md, "Warm-up"). Leaves no request state and no calibration or policy tallies (a head sets
        PyTorch's thread count to the target's, as its proposals do, and :meth:`close` restores it). Default:
        nothing to do (a draft model's first forward is its prompt's catch-up, which the policy times apart)."""

    # ---- one request ------------------------------------------------------------------------------

    def start(self, prompt: Sequence[int], messages: Sequence[dict] | None = None, tenant: str = "") -> DraftState:
        """A new request with ``prompt`` token ids, rendered from the chat ``messages`` (None: a raw prompt
        or ids; a drafter with another tokenizer renders them with its own chat template). ``tenant``
        names whose request it is (the server's API key or ``user`` field; "" for the CLI and library):
        a drafter that keeps text across requests keeps it per tenant."""
        return DraftState(prompt_len=len(prompt))

    @abc.abstractmethod
    def propose(
        self,
        state: DraftState,
        context: Sequence[int],
        max_tokens: int,
        sampler: Sampler,
        rng: np.random.Generator,
        min_confidence: float = 0.0,
        guide: DraftGuide | None = None,
    ) -> DraftProposal:
        """Propose up to ``max_tokens`` (>= 1) tokens following ``context`` (prompt + committed output).

        Args:
            state: this request's state (from :meth:`start`); the drafter first brings it up to
                ``context`` (what was accepted since its last proposal).
            context: every committed token id.
            max_tokens: most tokens (a tree: most depth) to propose.
            sampler: the request's sampler (a drafter that samples reports its processed q as ``probs``).
            rng: the request's random generator.
            min_confidence: what one more draft token costs, in tokens (0: the fixed policy, draft the whole
                budget); a drafter that pays per draft token may stop once the next token is expected to add
                less (:meth:`~speculative.drafters.calibration.AcceptanceCalibration.worth_drafting`).
            guide: the request's output constraint as a :class:`~speculative.constraints.DraftGuide`, for
                :attr:`steerable` drafters; None when the output is unconstrained or the drafter is not steerable.
        """

    def observe_hidden(self, state: DraftState, start: int, hidden: np.ndarray) -> None:
        """The target's hidden states ``[n, H]`` after the committed tokens at positions ``start ..
        start+n-1`` (each row is what the target's head reads to predict the next token): at prefill,
        and after each step for the tokens it fed and accepted. Only for :attr:`needs_hidden` drafters."""

    def catchup_tokens(self, state: DraftState, context: Sequence[int]) -> int:
        """Tokens the drafter would have to process before drafting after ``context`` beyond what its
        first draft forward feeds anyway (a draft model's lazy prompt prefill); 0 when up to date or
        when it has no model."""
        return 0

    def limit_context(self, state: DraftState, context: Sequence[int], n_tokens: int) -> None:
        """Condition this request's drafts on (about) the last ``n_tokens`` of the context only, so that
        catching up costs less (drafts stay verified, so output is unchanged; acceptance may drop)."""

    def finish(self, state: DraftState, context: Sequence[int] | None = None) -> None:
        """The request ended with ``context`` (prompt + every committed token; None when unknown): free its
        state (a drafter that learns across requests keeps the context for later ones; a model drafter
        scores its last proposal into the calibration it keeps)."""

    # ---- the drafter's lifetime -------------------------------------------------------------------

    def reset_caches(self) -> None:
        """Drop any cached keys/values kept for prefix reuse (benchmarks start each run cold)."""

    def close(self) -> None:
        """Free models and caches."""


class ModelDrafter(Drafter):
    """A drafter that runs a draft model (``model``, a backend of its own, one sequence per request).

    Attributes:
        calibrations: how its confidence predicts acceptance, kept across requests, one per tenant
            (:class:`~speculative.drafters.calibration.TenantCalibrations`).
    """

    runs_network = True

    def __init__(self, model: Backend):
        super().__init__()
        self.model = model
        self.calibrations = TenantCalibrations()

    def non_embedding_parameters(self) -> int:
        return self.model.non_embedding_parameters()

    def _catch_up(self, seq_id: int, pending: list[int]) -> tuple[list[int], float, int]:
        """Feed all but the last of ``pending`` to the draft model's sequence ``seq_id`` (no logits).
        Returns the last token, still to be fed with the first draft forward, the seconds the
        catch-up took and the tokens it fed (for the proposal's ``catchup_s`` and ``catchup_tokens``)."""
        t0 = time.perf_counter()
        self.model.forward([ForwardRequest(seq_id, pending[:-1], logits="none")])
        return pending[-1:], time.perf_counter() - t0, len(pending) - 1

    def finish(self, state: DraftState, context: Sequence[int] | None = None) -> None:
        scorer = getattr(state, "scorer", None)
        if scorer is not None and context is not None:
            scorer.score(context)  # the last proposal's outcome, for the calibration the drafter keeps
        self.model.release_sequence(state.seq_id)

    def reset_caches(self) -> None:
        for s in range(self.model.max_sequences):
            self.model.truncate(s, 0)

    def close(self) -> None:
        self.model.close()


class NoDrafter(Drafter):
    """``none``: propose nothing, so every step is a plain autoregressive step (the baseline)."""

    kind = "none"

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        return DraftProposal()
