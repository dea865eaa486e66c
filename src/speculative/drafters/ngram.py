"""Prompt lookup / n-gram drafting (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's lookup).

The last n tokens of the context (n from ``max`` down to ``min``) are looked
up among earlier occurrences in the prompt and the output so far; the tokens
that followed the most recent occurrence are proposed. No model runs, so a
draft costs microseconds; proposals are deterministic (q = one-hot), so under
sampling a draft token x is accepted with probability p(x).

The index is incremental: each committed token adds at most ``max - min + 1``
dictionary entries, and a lookup is ``max - min + 1`` dictionary probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import DraftProposal, DraftState, Drafter


@dataclass
class NgramState(DraftState):
    tokens: list[int] = field(default_factory=list)
    # n -> n-gram -> end index (of its last token) of its most recent occurrence
    index: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    indexed_upto: int = 0  # n-grams ending before this index are in the index


class NgramDrafter(Drafter):
    """``ngram[,min=N][,max=N]``: propose the continuation of the longest matching n-gram.

    Args:
        min_n: shortest n-gram to match (>= 1).
        max_n: longest n-gram to match (>= min_n).
    """

    kind = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4):
        super().__init__()
        if min_n < 1 or max_n < min_n:
            raise ConfigError(f"ngram needs 1 <= min <= max, got min={min_n}, max={max_n}")
        self.min_n = int(min_n)
        self.max_n = int(max_n)

    @property
    def description(self) -> str:
        return f"ngram(min={self.min_n},max={self.max_n})"

    def start(self, prompt: Sequence[int]) -> NgramState:
        st = NgramState(prompt_len=len(prompt), index={n: {} for n in range(self.min_n, self.max_n + 1)})
        self._sync(st, prompt)
        return st

    def _sync(self, st: NgramState, context: Sequence[int]) -> None:
        n_old = len(st.tokens)
        if len(context) < n_old or list(context[:n_old]) != st.tokens:
            # the context was rewritten (not just extended): rebuild
            st.tokens = []
            st.index = {n: {} for n in range(self.min_n, self.max_n + 1)}
            st.indexed_upto = 0
            n_old = 0
        st.tokens.extend(int(t) for t in context[n_old:])
        toks = st.tokens
        # index n-grams ending at e <= len-2: each has at least one token after it,
        # and the suffix ending at len-1 is not matched against itself
        index = st.index
        for e in range(st.indexed_upto, len(toks) - 1):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                index[n][tuple(toks[e - n + 1 : e + 1])] = e
        st.indexed_upto = max(st.indexed_upto, len(toks) - 1)

    def propose(self, state, context, max_tokens, sampler, rng) -> DraftProposal:
        self._sync(state, context)
        toks = state.tokens
        L = len(toks)
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            e = state.index[n].get(tuple(toks[L - n :]))
            if e is not None:
                return DraftProposal(tokens=toks[e + 1 : e + 1 + max_tokens])
        return DraftProposal()
