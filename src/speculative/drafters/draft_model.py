"""An independent draft model sharing the target's vocabulary (Leviathan et al. 2023; Chen et al. 2023).

The draft model has its own KV cache (one sequence per request) on the same
backend kind as the target. Each proposal first brings the cache up to the
committed context by its longest common prefix (rolling back rejected draft
tokens, adding the accepted ones and the bonus/residual token), then drafts
autoregressively, one token per forward pass.

A draft model whose context window is shorter than the target's slides: when
the context no longer fits, it restarts from the last half-window of tokens
(one prefill per half-window). Verification does not depend on the draft, so
output stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend, ForwardRequest, common_prefix_len
from ..errors import VocabularyMismatchError
from .base import DraftProposal, DraftState, ModelDrafter
from .calibration import ShadowScorer, confidence_bucket, confidence_scorer

#: at most this many committed tokens the draft model has not seen are fed with its first draft
#: forward; more (the prompt, or the output of steps that did not draft) are a separate catch-up
_FEED_WITH_FIRST_DRAFT = 8


@dataclass
class DraftModelState(DraftState):
    seq_id: int = 0
    offset: int = 0  # context[offset:] is what the draft cache mirrors (sliding window)
    scorer: ShadowScorer = field(default_factory=ShadowScorer)
    synced: bool = False  # the cache has been brought to this request's context (a prefix of it since)


def _top_probability(row: np.ndarray) -> float:
    """Largest softmax probability of a logits row (the greedy draft's confidence)."""
    m = float(np.max(row))
    return 1.0 / float(np.sum(np.exp(row - m, dtype=np.float32)))


def _vocab_summary(b: Backend) -> str:
    return f"{b.model_id} ({b.vocab_size:,} tokens, {b.name})"


def check_same_vocabulary(target: Backend, draft: Backend) -> None:
    """Raise :class:`VocabularyMismatchError`, naming both vocabularies, unless they match."""
    if target.vocab_size != draft.vocab_size:
        raise VocabularyMismatchError(
            f"draft model vocabulary {_vocab_summary(draft)} differs from target vocabulary "
            f"{_vocab_summary(target)}: a draft model must share the target's tokenizer"
        )
    a, b = target.vocabulary_sample(), draft.vocabulary_sample()
    for (i, ta), (_, tb) in zip(a, b):
        if ta != tb:
            raise VocabularyMismatchError(
                f"draft model vocabulary {_vocab_summary(draft)} differs from target vocabulary "
                f"{_vocab_summary(target)}: token {i} is {tb!r} in the draft and {ta!r} in the target"
            )


class DraftModelDrafter(ModelDrafter):
    """``model:NAME_OR_PATH``: a small causal LM with the target's vocabulary.

    Args:
        model: the loaded draft :class:`~speculative.backends.base.Backend`.
    """

    kind = "model"
    steerable = True

    @property
    def description(self) -> str:
        return f"model:{self.model.model_id}"

    def bind(self, target: Backend) -> None:
        check_same_vocabulary(target, self.model)
        super().bind(target)

    def start(self, prompt: Sequence[int], messages: Sequence[dict] | None = None, tenant: str = "") -> DraftModelState:
        # the prompt is prefilled lazily, by the first proposal: a request whose drafts would
        # not pay (the adaptive policy decides per step) never pays the draft model's prefill
        return DraftModelState(
            prompt_len=len(prompt),
            seq_id=self.model.allocate_sequence(prompt),
            scorer=confidence_scorer(self.calibrations.get(tenant)),
        )

    def _window(self, st: DraftModelState, context: Sequence[int], max_tokens: int) -> Sequence[int]:
        n_ctx = self.model.n_ctx
        if len(context) - st.offset + max_tokens > n_ctx:
            st.offset = max(0, len(context) - n_ctx // 2)
        return context[st.offset :]

    def catchup_tokens(self, state: DraftModelState, context: Sequence[int]) -> int:
        cached = self.model.cached_tokens(state.seq_id)
        n = len(context) - state.offset
        if state.synced and n - len(cached) <= _FEED_WITH_FIRST_DRAFT:
            return 0  # up to date (once synced, the cache is a prefix of the context and its draft)
        n -= common_prefix_len(cached, context[state.offset :])  # a new request: its prompt
        return n if n > _FEED_WITH_FIRST_DRAFT else 0

    def limit_context(self, state: DraftModelState, context: Sequence[int], n_tokens: int) -> None:
        state.offset = max(state.offset, len(context) - max(1, int(n_tokens)))

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        """Draft autoregressively until ``max_tokens`` or until the next token is expected to add less than
        ``min_confidence`` tokens, its cost: the draft so far accepted whole with probability ``cum``, times
        the calibrated acceptance at the next position
        (:meth:`~speculative.drafters.calibration.AcceptanceCalibration.worth_drafting`).

        With ``guide`` (an output constraint) the draft model's logits are masked to the allowed
        tokens before sampling, so the reported q is the masked distribution it sampled from;
        drafting stops after a token that completes the grammar."""
        m = self.model
        state.scorer.score(context)
        cal = state.scorer.calibration
        max_tokens = min(max_tokens, m.n_ctx // 2)
        window = self._window(state, context, max_tokens)
        seq = state.seq_id
        kept = m.reuse_prefix(seq, window, keep_last=1)
        state.synced = True
        pending = list(window[kept:])
        catchup_s, caught_up = 0.0, 0
        if len(pending) > _FEED_WITH_FIRST_DRAFT:  # catch up: the prompt (lazy prefill), or a long pause
            pending, catchup_s, caught_up = self._catch_up(seq, pending)
        # a few pending tokens (after a fully accepted draft: its last token and the bonus token) go
        # into the first draft forward: one forward instead of two, and its time counts as drafting
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        conf: list[float] = []
        buckets: list[tuple] = []
        cum = 1.0
        for i in range(max_tokens):
            logits = m.forward([ForwardRequest(seq, pending, logits="last")])[0].logits
            row = logits[-1]
            if sampler.uses_history:
                row = sampler.adjust(logits[-1:], list(context) + tokens, ())[0]
            if guide is not None:
                row = np.where(guide.mask(), row, np.float32(-np.inf)).astype(np.float32, copy=False)
            tok, q = sampler.sample(row, rng)
            raw = float(q[tok]) if q is not None else _top_probability(row)
            b = confidence_bucket(raw, i)
            c = cal.estimate(b)
            tokens.append(tok)
            buckets.append(b)
            conf.append(c)
            if q is not None:
                probs.append(q)
            pending = [tok]
            cum *= c
            if i + 1 < max_tokens and not cal.worth_drafting(cum, i + 1, min_confidence):
                break  # the next token would not be worth its cost
            if guide is not None and (not guide.push(tok) or guide.stopped):
                break  # the draft completes the grammar: nothing may follow
        # the last draft token is not fed: if all are accepted, the next proposal feeds it
        state.scorer.record(len(context), tokens, buckets)
        return DraftProposal(tokens=tokens, probs=np.stack(probs) if probs else None, confidence=conf,
                             catchup_s=catchup_s, catchup_tokens=caught_up)
