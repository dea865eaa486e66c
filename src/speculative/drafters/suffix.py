"""Suffix decoding: a model-free drafter that continues text seen in this request and in earlier ones
(Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications",
NeurIPS 2025; vLLM ships it through Arctic Inference).

Each step the drafter finds the longest suffix of the context (up to ``max`` tokens, the pattern
length p) that occurs in the request's own prompt and output or in earlier requests' prompts and
outputs (:mod:`speculative.drafters.suffix_index`), merges the continuations of its occurrences into
a token tree counted by how often each was seen, and proposes the most probable nodes, at most
``factor`` x p of them (section 3.3: a long match earns a long speculation). The adaptive policy
then verifies what pays at the measured T(n), as for every drafter.

Confidence: a node's empirical probability given its parent (count(node) / count(parent)) and the
pattern length bucket a calibrated acceptance estimate (:mod:`speculative.drafters.calibration`),
scored on every proposal once the committed text covers it. The calibration and the index of
earlier requests are kept per tenant (:class:`SuffixCache`): a request never reads another tenant's
text, nor statistics measured on it.

Memory: earlier requests are kept up to ``capacity`` tokens for all tenants together, the oldest
sequence evicted first; ``cache=PATH`` keeps them in a file across processes (written atomically
every few requests and at close, read at start, refused with a one-line error when it was written
for another target).
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .base import DraftProposal, DraftState, Drafter
from .calibration import MAX_POS_BUCKET, AcceptanceCalibration, ShadowScorer
from .suffix_index import CandidateTree, SequenceIndex, continuation_tree

#: pattern-length buckets of the calibration: p in [1], [2], [3, 4], [5, 8], [9, 16], [17, ...]
_P_EDGES = (1, 2, 4, 8, 16)
#: prior acceptance per pattern-length bucket for a node whose empirical probability is 1 (scaled
#: by the node's probability), worth 2 observations; the request's and tenant's own outcomes take over
_P_PRIOR = (0.3, 0.45, 0.6, 0.75, 0.85, 0.9)
_PROB_BINS = 5
_PRIOR_STRENGTH = 2.0
#: file format of ``cache=PATH``
_CACHE_VERSION = 1


def _p_bucket(p: int) -> int:
    return sum(p > e for e in _P_EDGES)


def _bucket(p: int, prob: float, depth: int) -> tuple[int, int, int]:
    return (_p_bucket(p), min(int(prob * _PROB_BINS), _PROB_BINS - 1), min(depth, MAX_POS_BUCKET))


def _priors() -> dict[tuple, tuple[float, float]]:
    out = {}
    for pb, rate in enumerate(_P_PRIOR):
        for b in range(_PROB_BINS):
            r = rate * (b + 0.5) / _PROB_BINS
            for d in range(MAX_POS_BUCKET + 1):
                out[(pb, b, d)] = (_PRIOR_STRENGTH * r, _PRIOR_STRENGTH * (1 - r))
    return out


class SuffixCache:
    """Earlier requests' token sequences per tenant, with one token budget for all tenants.

    Args:
        capacity: most tokens kept over all tenants (0: unbounded); the oldest sequence goes first.
        max_pattern: longest match measured.
    """

    def __init__(self, capacity: int, max_pattern: int):
        self.capacity = int(capacity)
        self.max_pattern = int(max_pattern)
        self.indices: dict[str, SequenceIndex] = {}
        self.calibrations: dict[str, AcceptanceCalibration] = {}
        self._order: OrderedDict[tuple[str, int], int] = OrderedDict()  # (tenant, sid) -> tokens, oldest first
        self.tokens = 0

    def index(self, tenant: str) -> SequenceIndex:
        if tenant not in self.indices:
            self.indices[tenant] = SequenceIndex(0, self.max_pattern)
        return self.indices[tenant]

    def calibration(self, tenant: str) -> AcceptanceCalibration:
        if tenant not in self.calibrations:
            self.calibrations[tenant] = AcceptanceCalibration(prior=_priors())
        return self.calibrations[tenant]

    def add(self, tenant: str, tokens: Sequence[int]) -> None:
        """Keep a finished request's tokens (prompt and output), evicting the oldest past the budget."""
        if not tokens:
            return
        if self.capacity and len(tokens) > self.capacity:
            tokens = tokens[-self.capacity:]  # one request longer than the whole budget keeps its end
        sid = self.index(tenant).add(tokens)
        self._order[(tenant, sid)] = len(tokens)
        self.tokens += len(tokens)
        while self.capacity and self.tokens > self.capacity and len(self._order) > 1:
            (t, s), n = self._order.popitem(last=False)
            self.indices[t].remove(s)
            self.tokens -= n

    def sequences(self) -> list[tuple[str, list[int]]]:
        """Every kept sequence with its tenant, oldest first."""
        return [(t, list(self.indices[t].sequence(s))) for (t, s) in self._order]


@dataclass
class SuffixState(DraftState):
    tenant: str = ""
    local: SequenceIndex = field(default_factory=lambda: SequenceIndex(0))
    sid: int = 0
    synced: int = 0  # context tokens in ``local``
    scorer: ShadowScorer = field(default_factory=ShadowScorer)


class SuffixDrafter(Drafter):
    """``suffix[,max=P][,factor=F][,tree=W][,min_prob=Q][,global=on|off][,capacity=N][,cache=PATH]``.

    Args:
        max_pattern: longest pattern matched (tokens).
        factor: speculation size per matched token (at most factor x p nodes per proposal).
        tree: most children per node (0 or 1: a chain, the most frequent continuation).
        min_prob: nodes whose path probability falls below this are not proposed.
        use_global: also match earlier requests (per tenant).
        capacity: tokens of earlier requests kept (all tenants together).
        cache: a file that keeps earlier requests across processes (None: memory only).

    Raises:
        ConfigError: an option out of range, or a cache file written for another target or unreadable.
    """

    kind = "suffix"

    def __init__(self, max_pattern: int = 32, factor: float = 1.0, tree: int = 0, min_prob: float = 0.1,
                 use_global: bool = True, capacity: int = 200_000, cache: str | os.PathLike | None = None,
                 max_depth: int = 32):
        super().__init__()
        checks = ((max_pattern < 1, f"max={max_pattern} must be >= 1"), (factor <= 0, f"factor={factor:g} must be > 0"),
                  (tree < 0, f"tree={tree} must be >= 0"),
                  (not 0.0 <= min_prob < 1.0, f"min_prob={min_prob:g} must be in [0, 1)"),
                  (capacity < 0, f"capacity={capacity} must be >= 0"), (max_depth < 1, "max_depth must be >= 1"))
        for bad, what in checks:
            if bad:
                raise ConfigError(f"suffix drafter option {what}")
        self.max_pattern = int(max_pattern)
        self.factor = float(factor)
        self.tree = int(tree) if tree > 1 else 0
        self.min_prob = float(min_prob)
        self.use_global = bool(use_global)
        self.max_depth = int(max_depth)
        self.cache = SuffixCache(capacity, max_pattern)
        self.cache_path = Path(cache).expanduser() if cache else None
        self._unsaved = 0
        self._loaded = False

    @property
    def description(self) -> str:
        return (f"suffix(max={self.max_pattern},factor={self.factor:g}" + (f",tree={self.tree}" if self.tree else "")
                + ("" if self.use_global else ",global=off") + ")")

    # ---- persistence -------------------------------------------------------------------------------

    def _fingerprint(self) -> str:
        t = self.target
        return f"{getattr(t, 'model_id', '')}|{getattr(t, 'vocab_size', 0)}"

    def bind(self, target) -> None:
        super().bind(target)
        if self.cache_path is not None and not self._loaded:
            self._load()
        self._loaded = True

    def _load(self) -> None:
        p = self.cache_path
        if any(d.exists() and not d.is_dir() for d in p.parents):
            raise ConfigError(f"suffix cache {p}: {next(d for d in p.parents if d.exists() and not d.is_dir())} "
                              "is not a folder; choose another cache=PATH")
        if p.is_dir():
            raise ConfigError(f"suffix cache {p} is a folder; give a file path, e.g. cache={p}/suffix.npz")
        if not p.exists():
            return
        try:
            with np.load(p, allow_pickle=False) as z:
                version = int(z["version"])
                fingerprint = str(z["fingerprint"])
                tokens, offsets, tenants = z["tokens"], z["offsets"], [str(x) for x in z["tenants"]]
        except Exception as e:  # noqa: BLE001 - any unreadable file is one error
            raise ConfigError(f"suffix cache {p} is unreadable ({type(e).__name__}); delete it or choose another "
                              f"cache=PATH") from None
        if version != _CACHE_VERSION or fingerprint != self._fingerprint():
            raise ConfigError(f"suffix cache {p} was written for another target or format ({fingerprint}); "
                              f"delete it or choose another cache=PATH")
        for i, tenant in enumerate(tenants):
            self.cache.add(tenant, tokens[offsets[i]:offsets[i + 1]].tolist())

    def save(self) -> None:
        """Write the kept requests to ``cache`` (atomically: a temporary file renamed over it), if one was given.

        Raises:
            ConfigError: the file cannot be written (one line; the previous file, if any, is left whole).
        """
        if self.cache_path is None:
            return
        seqs = self.cache.sequences()
        offsets = np.cumsum([0] + [len(s) for _, s in seqs]).astype(np.int64)
        tokens = np.asarray([t for _, s in seqs for t in s], dtype=np.int32)
        p = self.cache_path
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                np.savez(f, version=np.int64(_CACHE_VERSION), fingerprint=np.str_(self._fingerprint()),
                         tokens=tokens, offsets=offsets, tenants=np.asarray([t for t, _ in seqs], dtype=np.str_))
            os.replace(tmp, p)
        except OSError as e:
            raise ConfigError(f"cannot write the suffix cache {p}: {e.strerror or e}") from None
        finally:
            if tmp.exists():
                tmp.unlink()
        self._unsaved = 0

    # ---- one request -------------------------------------------------------------------------------

    def start(self, prompt, messages=None, tenant: str = "") -> SuffixState:
        st = SuffixState(prompt_len=len(prompt), tenant=str(tenant or ""))
        st.sid = st.local.add([])
        st.scorer = ShadowScorer(self.cache.calibration(st.tenant))
        self._sync(st, prompt)
        return st

    def _sync(self, st: SuffixState, context: Sequence[int]) -> None:
        seq = st.local.sequence(st.sid)
        n = st.synced
        if len(context) < n or list(context[:n]) != list(seq[:n]):
            st.local.truncate(st.sid, 0)  # the context was rewritten: start over
            st.scorer.reset()
            n = 0
        st.local.extend(st.sid, context[n:])
        st.synced = len(context)

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        """The most frequent continuations of the longest matching suffix (see the module docstring).

        With ``guide`` (an output constraint), nodes whose path the constraint forbids are dropped."""
        self._sync(state, context)
        state.scorer.score(context)
        depth = min(max_tokens, self.max_depth)
        m = state.local.match(context, depth, exclude=state.sid)
        if self.use_global:
            g = self.cache.index(state.tenant).match(context, depth)
            if g.length > m.length:
                m = g
            elif g.length == m.length and g.length:
                m.continuations = m.continuations + g.continuations
        if m.length == 0:
            return DraftProposal()
        budget = max(1, min(int(math.ceil(self.factor * m.length)), 4 * depth))
        t: CandidateTree = continuation_tree(m.continuations, budget, self.min_prob, max(1, self.tree))
        if guide is not None:
            t = _constrain(t, guide)
        if not t.tokens:
            return DraftProposal()
        depths = []
        for p in t.parents:
            depths.append(0 if p < 0 else depths[p] + 1)
        keep = [i for i, d in enumerate(depths) if d < max_tokens]
        cal = state.scorer.calibration
        buckets = [_bucket(m.length, t.cond_prob[i], depths[i]) for i in range(len(t.tokens))]
        conf = [cal.estimate(b) for b in buckets]
        kept = set(keep)
        spine = [i for i in t.spine() if i in kept]
        state.scorer.record(len(context), [t.tokens[i] for i in spine], [buckets[i] for i in spine])
        if not self.tree:
            return DraftProposal(tokens=[t.tokens[i] for i in spine], confidence=[conf[i] for i in spine])
        new = {old: j for j, old in enumerate(keep)}
        return DraftProposal(tokens=[t.tokens[i] for i in keep], confidence=[conf[i] for i in keep],
                             parents=[-1 if t.parents[i] < 0 else new[t.parents[i]] for i in keep])

    def finish(self, state: SuffixState, context: Sequence[int] | None = None) -> None:
        """Keep the finished request's prompt and output for later requests of its tenant."""
        if self.use_global:
            if context is not None:
                self._sync(state, context)
            self.cache.add(state.tenant, list(state.local.sequence(state.sid)))
            self._unsaved += 1
            if self._unsaved >= 8:
                self.save()

    def reset_caches(self) -> None:
        """Nothing to do: the drafter keeps no key/value cache. What it learned from earlier requests stays
        (a benchmark replays sessions in order, as a server would see them); :meth:`forget` drops it."""

    def forget(self) -> None:
        """Drop every earlier request of every tenant (the file of ``cache=PATH`` is left as it is)."""
        self.cache = SuffixCache(self.cache.capacity, self.max_pattern)
        self._unsaved = 0

    def close(self) -> None:
        if self._unsaved:
            self.save()


def _constrain(t: CandidateTree, guide) -> CandidateTree:
    """The tree without nodes whose path the output constraint forbids."""
    out = CandidateTree()
    new: dict[int, int] = {}
    paths: dict[int, list[int]] = {-1: []}
    for i, tok in enumerate(t.tokens):
        p = t.parents[i]
        if p >= 0 and p not in new:
            continue
        path = paths[p if p < 0 else p] + [tok]
        if guide.valid_prefix(path) < len(path):
            continue
        new[i] = len(out.tokens)
        paths[i] = path
        out.tokens.append(tok)
        out.parents.append(-1 if p < 0 else new[p])
        out.cond_prob.append(t.cond_prob[i])
        out.path_prob.append(t.path_prob[i])
    return out
