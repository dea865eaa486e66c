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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend, ForwardRequest
from ..cost_model import AcceptanceCalibration
from ..sampling import Sampler

#: the share of a silenced drafter's sat-out decoding time that measuring it again may cost
#: (:meth:`Drafter.begin_request`): an exploration budget, like an epsilon-greedy rate
REMEASURE_BUDGET = 0.01


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
    """

    tokens: list[int] = field(default_factory=list)
    probs: np.ndarray | None = None
    confidence: list[float] | None = None
    parents: list[int] | None = None
    #: seconds of this proposal spent bringing the drafter up to the context (a draft model's
    #: lazy prompt prefill), not drafting: left out of the per-token draft cost estimate
    catchup_s: float = 0.0


@dataclass
class ShadowScorer:
    """Scores proposals against the tokens later committed, verified or not.

    Each recorded proposal carries a calibration bucket per token; once the
    committed context covers a token, the outcome (equal or not, given all
    earlier tokens of the proposal were) is folded into ``calibration``.
    Under sampling, P(committed == x) = p(x), the acceptance probability of a
    deterministic draft, so the estimates stay unbiased.
    """

    calibration: AcceptanceCalibration = field(default_factory=AcceptanceCalibration)
    pending: list[list] = field(default_factory=list)  # [start, tokens, buckets, scored]

    def record(self, start: int, tokens: Sequence[int], buckets: Sequence[tuple]) -> None:
        if tokens:
            self.pending.append([start, list(tokens), list(buckets), 0])

    def score(self, context: Sequence[int]) -> None:
        cal = self.calibration
        keep = []
        for item in self.pending:
            start, toks, buckets, done = item
            resolved = False
            while done < len(toks) and start + done < len(context):
                ok = context[start + done] == toks[done]
                cal.observe(buckets[done], ok)
                done += 1
                if not ok:
                    resolved = True
                    break
            if not resolved and done < len(toks):
                item[3] = done
                keep.append(item)
        self.pending = keep

    def reset(self) -> None:
        self.pending = []


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


@dataclass
class BackOff:
    """Exponential back-off of a drafter that pays per proposal (a draft model, a head).

    When even the first draft token of a proposal falls short of the confidence worth
    verifying, the next 1, 2, 4, ... (at most ``max_skip``) proposals are skipped, so a
    poorly matched drafter costs little; a promising proposal resets it.
    """

    max_skip: int = 16
    skip: int = 0  # proposals left to skip
    misses: int = 0  # consecutive proposals whose first token was not worth verifying

    def skipping(self) -> bool:
        """True (and one skip used) while backing off."""
        if self.skip > 0:
            self.skip -= 1
            return True
        return False

    def update(self, first_confidence: float | None, min_confidence: float) -> None:
        if min_confidence > 0 and (first_confidence is None or first_confidence < min_confidence):
            self.misses += 1
            self.skip = min(2 ** (self.misses - 1), self.max_skip)
        else:
            self.misses = 0


class Drafter(abc.ABC):
    """Base class of drafters. Subclasses implement :meth:`propose`."""

    #: the spec TYPE word this drafter registers under
    kind: str = "drafter"
    #: True for drafters that read the target's hidden states (EAGLE, Medusa):
    #: the engine then requests them and calls :meth:`observe_hidden`
    needs_hidden: bool = False
    #: how many trailing prompt positions' hidden states :meth:`observe_hidden` gets at prefill
    hidden_window: int = 0
    #: None: the target's final hidden states; else the layers whose hidden states (concatenated)
    #: the drafter reads (see ``ForwardRequest.hidden_layers``)
    hidden_layers: tuple[int, ...] | None = None
    #: True for drafters whose :meth:`propose` takes ``guide=``, a
    #: :class:`~speculative.constraints.DraftGuide` of the request's output constraint, and then
    #: proposes only allowed tokens (reporting as ``probs`` the masked distribution it sampled from)
    steerable: bool = False

    def __init__(self) -> None:
        self.target: Backend | None = None
        self._accepts = 0  # draft tokens accepted, over this drafter's verified drafts (all requests)
        self._rejects = 0  # verified drafts that ended in a rejection
        self._saving: float | None = None  # average measured net saving per drafted step, seconds
        self._step_tokens = 1.0  # average tokens a drafted step yielded
        self._measure_net = 0.0  # net seconds its drafted steps saved since the saving was last (re)measured
        self._silent_s = 0.0  # decoding seconds of requests it sat out since then, silenced

    @property
    def description(self) -> str:
        return self.kind

    def non_embedding_parameters(self) -> int | None:
        """The drafter's own parameters outside token embeddings and output head (None: no model)."""
        return None

    def draft_cost_estimate(self) -> float | None:
        """Seconds per draft token before any drafting, measured on this machine (None: unknown).

        The adaptive policy starts from it (a draft model that costs half a target step is
        seen before it drafts at all) and refines it online from the proposals' timings.
        """
        return None

    def model_time_s(self) -> float:
        """Seconds the drafter's own models have spent in forward passes so far (0 without a model)."""
        return 0.0

    def catchup_tokens(self, state: DraftState, context: Sequence[int]) -> int:
        """Tokens the drafter would have to process before drafting after ``context`` beyond what its
        first draft forward feeds anyway (a draft model's lazy prompt prefill); 0 when up to date or
        when it has no model."""
        return 0

    def catchup_cost_per_token(self) -> float | None:
        """Measured seconds per caught-up token (None: not measured yet)."""
        return None

    def limit_context(self, state: DraftState, context: Sequence[int], n_tokens: int) -> None:
        """Condition this request's drafts on (about) the last ``n_tokens`` of the context only, so that
        catching up costs less (drafts stay verified, so output is unchanged; acceptance may drop)."""

    def observe_verification(self, verified: int, accepted: int) -> None:
        """One verification of this drafter's draft: ``verified`` draft tokens (a chain, or a tree's
        depth), ``accepted`` of them accepted. Kept across requests, for :attr:`acceptance_rate`."""
        if verified <= 0:
            return
        self._accepts += accepted
        self._rejects += 1 if accepted < verified else 0

    def observe_saving(self, seconds: float, tokens: int) -> float:
        """Fold one drafted step's measured net saving (seconds; negative: it cost more than it saved)
        and the tokens it yielded into this drafter's running averages (exponential, weight 0.2; kept
        across requests) and return the average saving."""
        self._measure_net += seconds
        avg = self._saving
        if avg is None:
            self._saving, self._step_tokens = seconds, float(tokens)
        else:
            self._saving = avg + 0.2 * (seconds - avg)
            self._step_tokens += 0.2 * (tokens - self._step_tokens)
        return self._saving

    def begin_request(self) -> bool:
        """Called as an adaptive request starts; True when this request re-measures the drafter.

        A drafter whose measured net saving (:meth:`observe_saving`) is negative is not caught up on
        new prompts, so it would never draft again and its measurement would never change, although
        the workload may (code after translations). So the measurement is forgotten and taken afresh
        once the decoding time of the requests it sat out, times :data:`REMEASURE_BUDGET`, covers
        what the last measurement lost (its drafted steps' net saving, catch-up included): measuring
        again costs at most that share of the time spent silent, and a costly probe is repeated
        rarely, a cheap one soon.
        """
        if self._saving is None or self._saving > 0.0:
            self._silent_s = 0.0
            return False
        if self._silent_s * REMEASURE_BUDGET < -self._measure_net:
            return False
        self._saving, self._step_tokens = None, 1.0
        self._measure_net = self._silent_s = 0.0
        return True

    def end_request(self, decode_s: float, drafted: bool) -> None:
        """Called as an adaptive request ends: ``decode_s`` seconds of decoding (prefill excluded), and
        whether this drafter's drafts were verified in it. Time sat out while silenced counts towards
        the next re-measure (:meth:`begin_request`)."""
        if not drafted and self._saving is not None and self._saving <= 0.0:
            self._silent_s += max(0.0, decode_s)

    @property
    def silenced(self) -> bool:
        """True while a negative measured net saving silences the drafter (until :meth:`begin_request`
        forgets the measurement): a request that starts silenced decodes plainly and never calls it."""
        return self._saving is not None and self._saving <= 0.0

    def measured_saving_per_token(self) -> float | None:
        """Seconds saved per generated token while drafting, as measured over recent drafted steps
        (their average net saving over their average tokens); None before any was measured."""
        if self._saving is None:
            return None
        return self._saving / max(1.0, self._step_tokens)

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance rate alpha measured over this drafter's verified drafts so far.

        The geometric-acceptance estimate: accepted / (accepted + rejections), a rejection being the
        first refused token of a draft (tokens after it are never reached), with an optimistic prior of
        4 accepted and 1 rejected token (alpha 0.8) that the first few steps outweigh: a new drafter
        gets to draft, and so to be measured.
        """
        return (self._accepts + 4.0) / (self._accepts + self._rejects + 5.0)

    def bind(self, target: Backend) -> None:
        """Attach to the target once, checking compatibility (vocabulary, ...).

        Raises:
            VocabularyMismatchError: a draft model with another vocabulary.
        """
        self.target = target

    def start(self, prompt: Sequence[int]) -> DraftState:
        """New request with ``prompt`` token ids. May pre-compute (counted as prefill time)."""
        return DraftState(prompt_len=len(prompt))

    def start_request(self, prompt: Sequence[int], messages: Sequence[dict] | None = None) -> DraftState:
        """:meth:`start`, told the chat ``messages`` the prompt was rendered from (None: a raw prompt or
        ids). A drafter with another tokenizer renders them with its own chat template."""
        return self.start(prompt)

    @abc.abstractmethod
    def propose(
        self,
        state: DraftState,
        context: Sequence[int],
        max_tokens: int,
        sampler: Sampler,
        rng: np.random.Generator,
        min_confidence: float = 0.0,
    ) -> DraftProposal:
        """Propose up to ``max_tokens`` (>= 1) tokens following ``context`` (prompt + committed output).

        ``min_confidence``: a drafter that pays per draft token may stop once the
        cumulative confidence of its draft falls below this value (the adaptive
        policy would not verify further tokens).

        Steerable drafters (``steerable = True``) also get ``guide=`` under an output
        constraint (see :class:`~speculative.constraints.DraftGuide`).
        """

    def observe_hidden(self, state: DraftState, start: int, hidden: np.ndarray) -> None:
        """The target's final hidden states ``[n, H]`` after the context tokens at positions
        ``start .. start+n-1`` (each row is what the target's head reads to predict the next token)."""

    def finish(self, state: DraftState) -> None:
        """The request ended; free its state."""

    def reset_caches(self) -> None:
        """Drop any cached keys/values kept for prefix reuse (benchmarks start each run cold)."""

    def close(self) -> None:
        """Free models and caches."""


class ModelDrafter(Drafter):
    """A drafter that runs a draft model (``model``, a backend of its own): its size, its
    measured cost per token and its forward time come from that model."""

    def __init__(self, model: Backend):
        super().__init__()
        self.model = model
        self._cost_estimate: float | None = None
        self._catchup_rate: float | None = None  # measured seconds per caught-up token

    def non_embedding_parameters(self) -> int:
        return self.model.non_embedding_parameters()

    def draft_cost_estimate(self) -> float | None:
        """The draft model's own T(1), measured once per machine and cached (:func:`cached_verify_cost`)."""
        if self._cost_estimate is None:
            from ..cost_model import cached_verify_cost

            self._cost_estimate = cached_verify_cost(self.model).time(1)
        return self._cost_estimate

    def model_time_s(self) -> float:
        return getattr(self.model, "forward_time_s", 0.0)

    def catchup_cost_per_token(self) -> float | None:
        return self._catchup_rate

    def _catch_up(self, seq_id: int, pending: list[int]) -> tuple[list[int], float]:
        """Feed all but the last of ``pending`` to the draft model's sequence ``seq_id`` (no logits) and
        fold the time into the measured catch-up rate (forwards of >= 32 tokens). Returns the last
        token, still to be fed with the first draft forward, and the seconds the catch-up took."""
        t0 = time.perf_counter()
        self.model.forward([ForwardRequest(seq_id, pending[:-1], logits="none")])
        seconds = time.perf_counter() - t0
        n = len(pending) - 1
        if n >= 32 and seconds > 0:
            old = self._catchup_rate
            self._catchup_rate = seconds / n if old is None else old + 0.3 * (seconds / n - old)
        return pending[-1:], seconds


class NoDrafter(Drafter):
    """``none``: propose nothing, so every step is a plain autoregressive step (the baseline)."""

    kind = "none"

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0) -> DraftProposal:
        return DraftProposal()
