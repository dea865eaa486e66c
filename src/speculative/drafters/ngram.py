"""Prompt lookup / n-gram drafting (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's lookup).

The last n tokens of the context (n from ``max`` down to ``min``) are looked
up among earlier occurrences in the prompt and the output so far; the tokens
that followed the most recent occurrence are proposed. No model runs, so a
draft costs microseconds; proposals are deterministic (q = one-hot), so under
sampling a draft token x is accepted with probability p(x).

Confidence: every proposal (verified or not) is scored once the tokens it
predicted are committed ("shadow evaluation", free because drafting is free),
giving per-request estimates of P(token i accepted | tokens before it were),
bucketed by match length n and draft position, with Beta priors measured on
the project's development prompts. The adaptive draft policy
(:mod:`speculative.cost_model`) verifies only the tokens worth their cost.

The index is incremental: each committed token adds at most ``max - min + 1``
dictionary entries, and a lookup is ``max - min + 1`` dictionary probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import DraftProposal, DraftState, Drafter
from .calibration import MAX_POS_BUCKET, AcceptanceCalibration, ShadowScorer

#: Beta(a, b) priors of P(accepted | previous accepted) per (match length n,
#: draft position), worth 4 observations: acceptance measured by shadow
#: evaluation in greedy runs on the development prompts (speculative/data/devset.jsonl,
#: 128 new tokens, both bundled targets weighted equally). Missing buckets use
#: the nearest smaller n.
_PRIOR_RATES: dict[tuple[int, int], float] = {
    (1, 0): 0.27, (1, 1): 0.56, (1, 2): 0.74, (1, 3): 0.80,
    (2, 0): 0.44, (2, 1): 0.67, (2, 2): 0.70, (2, 3): 0.79,
    (3, 0): 0.55, (3, 1): 0.75, (3, 2): 0.67, (3, 3): 0.91,
    (4, 0): 0.90, (4, 1): 0.93, (4, 2): 0.94, (4, 3): 0.95,
}
_PRIOR_STRENGTH = 4.0
NGRAM_PRIORS = {b: (r * _PRIOR_STRENGTH, (1 - r) * _PRIOR_STRENGTH) for b, r in _PRIOR_RATES.items()}

def _prior(n: int, pos: int) -> tuple[float, float]:
    for m in range(n, 0, -1):
        if (m, pos) in NGRAM_PRIORS:
            return NGRAM_PRIORS[(m, pos)]
    return (1.0, 3.0)  # pragma: no cover - every n >= 1 has a prior


@dataclass
class NgramState(DraftState):
    tokens: list[int] = field(default_factory=list)
    # n -> n-gram -> end indices (of its last token) of its most recent occurrences, oldest first
    index: dict[int, dict[tuple[int, ...], list[int]]] = field(default_factory=dict)
    indexed_upto: int = 0  # n-grams ending before this index are in the index
    scorer: ShadowScorer = field(default_factory=ShadowScorer)


class NgramDrafter(Drafter):
    """``ngram[,min=N][,max=N][,tree=W]``: propose the continuation of the longest matching n-gram.

    With ``tree=W`` (W >= 2) the continuations of the W most recent occurrences of
    that n-gram are merged into a token tree (a trie: the most recent occurrence is
    the spine), each branch's confidence scaled by the share of occurrences behind it.

    Args:
        min_n: shortest n-gram to match (>= 1).
        max_n: longest n-gram to match (>= min_n).
        tree: most leaves of a tree draft; 0 or 1 drafts a chain.
    """

    kind = "ngram"
    steerable = True
    _MAX_OCCURRENCES = 8

    def __init__(self, min_n: int = 1, max_n: int = 4, tree: int = 0):
        super().__init__()
        if min_n < 1 or max_n < min_n:
            raise ConfigError(f"ngram needs 1 <= min <= max, got min={min_n}, max={max_n}")
        if tree < 0 or tree > self._MAX_OCCURRENCES:
            raise ConfigError(f"ngram tree must be in 0..{self._MAX_OCCURRENCES}, got {tree}")
        self.min_n = int(min_n)
        self.max_n = int(max_n)
        self.tree = int(tree) if tree > 1 else 0
        self._priors = {
            (n, p): _prior(n, p) for n in range(self.min_n, self.max_n + 1) for p in range(MAX_POS_BUCKET + 1)
        }

    @property
    def description(self) -> str:
        return f"ngram(min={self.min_n},max={self.max_n}" + (f",tree={self.tree})" if self.tree else ")")

    def start(self, prompt: Sequence[int], messages: Sequence[dict] | None = None, tenant: str = "") -> NgramState:
        st = NgramState(
            prompt_len=len(prompt),
            index={n: {} for n in range(self.min_n, self.max_n + 1)},
            scorer=ShadowScorer(AcceptanceCalibration(prior=self._priors)),
        )
        self._sync(st, prompt)
        return st

    def _sync(self, st: NgramState, context: Sequence[int]) -> None:
        n_old = len(st.tokens)
        if len(context) < n_old or list(context[:n_old]) != st.tokens:
            # the context was rewritten (not just extended): rebuild
            st.tokens = []
            st.index = {n: {} for n in range(self.min_n, self.max_n + 1)}
            st.indexed_upto = 0
            st.scorer.reset()
            n_old = 0
        st.tokens.extend(int(t) for t in context[n_old:])
        toks = st.tokens
        # index n-grams ending at e <= len-2: each has at least one token after it,
        # and the suffix ending at len-1 is not matched against itself
        index = st.index
        cap = self._MAX_OCCURRENCES
        for e in range(st.indexed_upto, len(toks) - 1):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                occ = index[n].setdefault(tuple(toks[e - n + 1 : e + 1]), [])
                occ.append(e)
                if len(occ) > cap:
                    del occ[0]
        st.indexed_upto = max(st.indexed_upto, len(toks) - 1)

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        """The continuation of the longest matching n-gram's most recent occurrence.

        With ``guide`` (an output constraint), each continuation is cut at its first forbidden
        token, and the occurrence whose allowed continuation is longest is proposed (the most
        recent among equals); n-grams with no allowed continuation are skipped. The proposal
        still depends on the context only (q stays one-hot), so verification is unchanged.
        """
        self._sync(state, context)
        state.scorer.score(state.tokens)
        toks = state.tokens
        L = len(toks)
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            occ = state.index[n].get(tuple(toks[L - n :]))
            if occ and guide is not None:
                occ = self._allowed_occurrences(occ, toks, max_tokens, guide)  # empty: try a shorter n-gram
            if occ:
                e = occ[-1]
                prop = toks[e + 1 : e + 1 + max_tokens]
                if guide is not None:
                    prop = prop[: guide.valid_prefix(prop)]
                buckets = [(n, min(i, MAX_POS_BUCKET)) for i in range(len(prop))]
                state.scorer.record(L, prop, buckets)  # the spine is what gets calibrated
                cal = state.scorer.calibration
                if not self.tree:
                    return DraftProposal(tokens=prop, confidence=[cal.estimate(b) for b in buckets])
                conts = [toks[x + 1 : x + 1 + max_tokens] for x in reversed(occ)][: self.tree]
                if guide is not None:
                    conts = [c[: guide.valid_prefix(c)] for c in conts]
                return self._trie(conts, n, cal)
        return DraftProposal()

    @staticmethod
    def _allowed_occurrences(occ: list[int], toks: list[int], max_tokens: int, guide) -> list[int]:
        """Occurrences (oldest first) whose continuation starts with an allowed token, reordered so
        that the one with the longest allowed continuation (the most recent among equals) is last."""
        allowed = [(guide.valid_prefix(toks[x + 1 : x + 1 + max_tokens]), x) for x in occ]
        allowed = [(v, x) for v, x in allowed if v > 0]
        if not allowed:
            return []
        best = max(range(len(allowed)), key=lambda i: (allowed[i][0], i))
        return [x for i, (_, x) in enumerate(allowed) if i != best] + [allowed[best][1]]

    @staticmethod
    def _trie(conts: list[list[int]], n: int, cal) -> DraftProposal:
        """Merge continuations (most recent first) into a tree; node confidence = the calibrated
        estimate for its depth times the share of continuations through it among its parent's."""
        tokens: list[int] = []
        parents: list[int] = []
        support: list[int] = []
        child_of: dict[tuple[int, int], int] = {}
        for c in conts:
            u = -1
            for t in c:
                key = (u, t)
                if key not in child_of:
                    child_of[key] = len(tokens)
                    tokens.append(t)
                    parents.append(u)
                    support.append(0)
                u = child_of[key]
                support[u] += 1
        total = {-1: len(conts)}
        for i in range(len(tokens)):
            total[i] = support[i]
        depth: list[int] = []
        conf = []
        for i, p in enumerate(parents):
            d = 0 if p < 0 else depth[p] + 1
            depth.append(d)
            conf.append(cal.estimate((n, min(d, MAX_POS_BUCKET))) * support[i] / total[p])
        return DraftProposal(tokens=tokens, confidence=conf, parents=parents)
