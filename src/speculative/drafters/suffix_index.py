"""Suffix matching over token sequences, for suffix decoding (Oliaro et al., "SuffixDecoding:
Extreme Speculative Decoding for Emerging AI Applications", NeurIPS 2025, sections 3.1-3.3).

SuffixDecoding keeps suffix trees over the current request's prompt and output and over earlier
requests' outputs; each speculation finds the longest suffix of the context (the pattern, up to
``max_pattern`` tokens) that occurs in them, and grows a token tree from the continuations of its
occurrences, scored by how often each was seen. A suffix tree node's subtree holds exactly the
continuations of the occurrences of its path; this module computes the same thing lazily from an
occurrence index instead of keeping a tree of every suffix (which in Python would cost hundreds of
bytes per node and depth-many nodes per token):

* :class:`SequenceIndex` stores token sequences and, for a few anchor lengths (1, 3 and 8 tokens),
  the most recent positions where each anchor n-gram ends. A query takes the longest anchor of the
  context that occurs, extends each occurrence's match backwards token by token (up to
  ``max_pattern``), and keeps the occurrences with the longest match: the pattern's suffix-tree node.
* :func:`continuation_tree` merges those occurrences' continuations into a trie whose counts are the
  subtree counts of that node, and selects nodes best-first by empirical probability (the product of
  count(child) / count(parent) along the path) down to ``min_prob``, at most ``max_nodes``.

Memory is bounded: :class:`SequenceIndex` with ``capacity`` tokens evicts whole sequences, oldest
first, and drops their index entries; an anchor keeps at most ``max_occurrences`` positions.
Everything is token ids, so matching is exact for any tokenizer.
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

#: anchor n-gram lengths, longest first
ANCHORS = (8, 3, 1)


@dataclass
class Match:
    """Where the context's longest matching suffix occurs.

    Attributes:
        length: the pattern length p (matched tokens, at most the index's ``max_pattern``).
        continuations: for each occurrence, the tokens that followed it (at most ``depth``), most
            recent occurrence first.
    """

    length: int = 0
    continuations: list[list[int]] = field(default_factory=list)


class SequenceIndex:
    """Token sequences with an index of where each anchor n-gram ends (see the module docstring).

    Args:
        capacity: most tokens kept (0: unbounded); past it, whole sequences are evicted oldest first.
        max_pattern: longest match a query measures.
        max_occurrences: positions kept per anchor n-gram (the most recent).

    Raises:
        ValueError: a negative capacity, or max_pattern / max_occurrences < 1.
    """

    def __init__(self, capacity: int = 0, max_pattern: int = 32, max_occurrences: int = 64):
        if capacity < 0 or max_pattern < 1 or max_occurrences < 1:
            raise ValueError("capacity must be >= 0, max_pattern and max_occurrences >= 1")
        self.capacity = int(capacity)
        self.max_pattern = int(max_pattern)
        self.max_occurrences = int(max_occurrences)
        self._seqs: OrderedDict[int, array] = OrderedDict()  # id -> tokens, oldest first
        self._index: dict[int, dict[tuple, list[int]]] = {n: {} for n in ANCHORS}  # n -> n-gram -> [packed pos]
        self._next_id = 0
        self.tokens = 0  # tokens held

    # positions are packed as seq_id * 2**32 + end index (of the anchor's last token)
    @staticmethod
    def _pack(sid: int, end: int) -> int:
        return (sid << 32) | end

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, tokens: Sequence[int]) -> int:
        """Store a new sequence; returns its id. Evicts the oldest sequences past ``capacity``."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = array("i")
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence ``sid`` (indexing the anchors that now end inside it)."""
        seq = self._seqs[sid]
        start = len(seq)
        seq.extend(int(t) for t in tokens)
        self.tokens += len(seq) - start
        cap = self.max_occurrences
        for e in range(start, len(seq)):
            for n in ANCHORS:
                if e + 1 >= n:
                    occ = self._index[n].setdefault(tuple(seq[e - n + 1 : e + 1]), [])
                    occ.append(self._pack(sid, e))
                    if len(occ) > cap:
                        del occ[0]
        self._evict(keep=sid)

    def truncate(self, sid: int, length: int) -> None:
        """Cut sequence ``sid`` back to ``length`` tokens (a request whose context was rewritten)."""
        seq = self._seqs[sid]
        if length >= len(seq):
            return
        for e in range(length, len(seq)):
            for n in ANCHORS:
                if e + 1 >= n:
                    key = tuple(seq[e - n + 1 : e + 1])
                    occ = self._index[n].get(key)
                    if occ is not None:
                        packed = self._pack(sid, e)
                        if packed in occ:
                            occ.remove(packed)
                        if not occ:
                            del self._index[n][key]
        self.tokens -= len(seq) - length
        del seq[length:]

    def remove(self, sid: int) -> None:
        """Forget sequence ``sid`` and its index entries."""
        if sid in self._seqs:
            self.truncate(sid, 0)
            del self._seqs[sid]

    def _evict(self, keep: int) -> None:
        while self.capacity and self.tokens > self.capacity and len(self._seqs) > 1:
            oldest = next(iter(self._seqs))
            if oldest == keep:
                break
            self.remove(oldest)

    def sequence(self, sid: int) -> array:
        """The tokens of sequence ``sid`` (a live view: do not modify; KeyError if evicted)."""
        return self._seqs[sid]

    def sequences(self) -> list[list[int]]:
        """Every stored sequence, oldest first."""
        return [list(s) for s in self._seqs.values()]

    def match(self, context: Sequence[int], depth: int, exclude: int | None = None) -> Match:
        """The longest suffix of ``context`` (at most ``max_pattern`` tokens) that occurs in the stored
        sequences with at least one token after it, and up to ``depth`` tokens of each of its occurrences'
        continuations (most recent first).

        ``exclude``: a sequence id whose occurrences ending at its last token are skipped (the context
        itself, when it is stored: its own suffix is not a prediction).
        """
        L = len(context)
        if L == 0 or depth < 1:
            return Match()
        for n in ANCHORS:
            if n > L:
                continue
            occ = self._index[n].get(tuple(int(t) for t in context[L - n :]))
            if not occ:
                continue
            best, found = 0, []
            for packed in reversed(occ):
                sid, end = packed >> 32, packed & 0xFFFFFFFF
                seq = self._seqs.get(sid)
                if seq is None or end + 1 >= len(seq):
                    continue  # nothing follows (this is where the sequence ends so far)
                if sid == exclude and end == len(seq) - 1:
                    continue
                m = n  # the anchor matched; extend backwards
                while m < self.max_pattern and m < L and end - m >= 0 and seq[end - m] == context[L - 1 - m]:
                    m += 1
                if m > best:
                    best, found = m, [(sid, end)]
                elif m == best:
                    found.append((sid, end))
            if found:
                conts = [list(self._seqs[sid][end + 1 : end + 1 + depth]) for sid, end in found]
                return Match(best, conts)
        return Match()


@dataclass
class CandidateTree:
    """Selected continuation nodes: tokens, parents (-1: the context's last token, parents before
    children, siblings most frequent first), each node's empirical probability given its parent
    (count(node) / count(parent)) and its path probability."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    cond_prob: list[float] = field(default_factory=list)
    path_prob: list[float] = field(default_factory=list)

    def spine(self) -> list[int]:
        """The chain of first children from the root."""
        out, u = [], -1
        while True:
            nxt = next((i for i, p in enumerate(self.parents) if p == u), None)
            if nxt is None:
                return out
            out.append(nxt)
            u = nxt


def continuation_tree(continuations: Sequence[Sequence[int]], max_nodes: int, min_prob: float = 0.1,
                      max_width: int = 4) -> CandidateTree:
    """Merge continuations into a trie with counts and select nodes best-first by path probability
    (SuffixDecoding's greedy expansion, Oliaro et al. 2025, section 3.3): a node is taken when its
    parent was, its path probability is at least ``min_prob``, and fewer than ``max_nodes`` were taken;
    at most ``max_width`` children per node.

    Returns:
        The selected nodes in selection order, re-indexed so that parents come before children and the
        most probable child of every node comes first.
    """
    if max_nodes < 1 or not continuations:
        return CandidateTree()
    # trie: node -> {token: child}; counts per node
    children: list[dict[int, int]] = [{}]
    counts: list[int] = [len(continuations)]
    toks: list[int] = [-1]
    parent: list[int] = [-1]
    for cont in continuations:
        u = 0
        for t in cont:
            c = children[u].get(t)
            if c is None:
                c = len(toks)
                children[u][t] = c
                children.append({})
                counts.append(0)
                toks.append(int(t))
                parent.append(u)
            counts[c] += 1
            u = c
    # best-first expansion from the root
    taken: list[int] = []
    prob = {0: 1.0}
    heap = []
    for c in sorted(children[0].values(), key=lambda k: (-counts[k], k))[:max_width]:
        prob[c] = counts[c] / counts[0]
        heapq.heappush(heap, (-prob[c], c))
    while heap and len(taken) < max_nodes:
        negp, c = heapq.heappop(heap)
        if -negp < min_prob:
            break
        taken.append(c)
        kids = sorted(children[c].values(), key=lambda k: (-counts[k], k))[:max_width]
        for k in kids:
            prob[k] = prob[c] * counts[k] / counts[c]
            heapq.heappush(heap, (-prob[k], k))
    # re-index: depth-first with the most frequent child first (among equals the most recent occurrence's,
    # inserted first), so the spine is laid out first
    taken_set = set(taken)
    order: list[int] = []
    stack = sorted((c for c in children[0].values() if c in taken_set), key=lambda k: (counts[k], -k))
    while stack:
        u = stack.pop()
        order.append(u)
        stack.extend(sorted((c for c in children[u].values() if c in taken_set), key=lambda k: (counts[k], -k)))
    new = {old: i for i, old in enumerate(order)}
    tree = CandidateTree()
    for old in order:
        p = parent[old]
        tree.tokens.append(toks[old])
        tree.parents.append(-1 if p == 0 else new[p])
        tree.cond_prob.append(counts[old] / counts[p])
        tree.path_prob.append(prob[old])
    return tree
