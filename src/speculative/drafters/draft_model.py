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

from ..backends.base import Backend, ForwardRequest
from ..errors import VocabularyMismatchError
from ..cost_model import AcceptanceCalibration
from .base import BackOff, DraftProposal, DraftState, Drafter, ShadowScorer


@dataclass
class DraftModelState(DraftState):
    seq_id: int = 0
    offset: int = 0  # context[offset:] is what the draft cache mirrors (sliding window)
    scorer: ShadowScorer = field(default_factory=ShadowScorer)
    backoff: BackOff = field(default_factory=BackOff)


_N_BINS = 10
_MAX_POS_BUCKET = 3


def _bucket(conf: float, pos: int) -> tuple[int, int]:
    return (min(int(conf * _N_BINS), _N_BINS - 1), min(pos, _MAX_POS_BUCKET))


# Beta priors centred on the bin's raw confidence (trust the draft model until
# the request's own outcomes say otherwise), worth 2 observations.
_PRIORS = {
    (b, p): (2.0 * (b + 0.5) / _N_BINS, 2.0 * (1 - (b + 0.5) / _N_BINS))
    for b in range(_N_BINS)
    for p in range(_MAX_POS_BUCKET + 1)
}


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


class DraftModelDrafter(Drafter):
    """``model:NAME_OR_PATH``: a small causal LM with the target's vocabulary.

    Args:
        model: the loaded draft :class:`~speculative.backends.base.Backend`.
    """

    kind = "model"

    def __init__(self, model: Backend):
        super().__init__()
        self.model = model

    @property
    def description(self) -> str:
        return f"model:{self.model.model_id}"

    def non_embedding_parameters(self) -> int:
        return self.model.non_embedding_parameters()

    def bind(self, target: Backend) -> None:
        check_same_vocabulary(target, self.model)
        super().bind(target)

    def start(self, prompt: Sequence[int]) -> DraftModelState:
        st = DraftModelState(
            prompt_len=len(prompt),
            seq_id=self.model.allocate_sequence(prompt),
            scorer=ShadowScorer(AcceptanceCalibration(prior=_PRIORS)),
        )
        # prefill the prompt now, but its last token, which the first proposal feeds
        window = self._window(st, prompt, 1)
        kept = self.model.reuse_prefix(st.seq_id, window, keep_last=1)
        if len(window) - 1 > kept:
            self.model.forward([ForwardRequest(st.seq_id, window[kept:-1], logits="none")])
        return st

    def _window(self, st: DraftModelState, context: Sequence[int], max_tokens: int) -> Sequence[int]:
        n_ctx = self.model.n_ctx
        if len(context) - st.offset + max_tokens > n_ctx:
            st.offset = max(0, len(context) - n_ctx // 2)
        return context[st.offset :]

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0) -> DraftProposal:
        """Draft autoregressively until ``max_tokens`` or until the cumulative confidence falls below
        ``min_confidence``. When even the first token keeps falling short, drafting backs off
        exponentially (skips 1, 2, 4, ... up to 16 steps between probes), so a poorly matched
        draft model costs little."""
        m = self.model
        state.scorer.score(context)
        if state.backoff.skipping():
            return DraftProposal()
        cal = state.scorer.calibration
        max_tokens = min(max_tokens, m.n_ctx // 2)
        window = self._window(state, context, max_tokens)
        seq = state.seq_id
        kept = m.reuse_prefix(seq, window, keep_last=1)
        pending = list(window[kept:])
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
            tok, q = sampler.sample(row, rng)
            raw = float(q[tok]) if q is not None else _top_probability(row)
            b = _bucket(raw, i)
            c = cal.estimate(b)
            tokens.append(tok)
            buckets.append(b)
            conf.append(c)
            if q is not None:
                probs.append(q)
            pending = [tok]
            cum *= c
            if cum < min_confidence:
                break  # further tokens would not be verified
        state.backoff.update(conf[0] if conf else None, min_confidence)
        # the last draft token is not fed: if all are accepted, the next proposal feeds it
        state.scorer.record(len(context), tokens, buckets)
        return DraftProposal(tokens=tokens, probs=np.stack(probs) if probs else None, confidence=conf)

    def finish(self, state: DraftState) -> None:
        self.model.release_sequence(state.seq_id)

    def reset_caches(self) -> None:
        for s in range(self.model.max_sequences):
            self.model.truncate(s, 0)

    def close(self) -> None:
        self.model.close()
