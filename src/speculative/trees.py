"""Token trees: several draft candidates per position, verified together in one target pass.

A tree has nodes 0..n-1; node i holds a draft token and ``parents[i]``, the
index of its parent node, or -1 for the root, which is the last committed
token (not part of the tree's node list). Parents come before children. Each
node sits at depth 1 + depth(parent), i.e. at position ``L - 1 + depth`` when
the context has L tokens, and attends to the cached context and its ancestors
only (tree attention: SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024,
section 2.1.2).

Static shapes use Medusa's "choices" notation: a node is the path of candidate
ranks from the root, e.g. ``(0,)`` = the top-1 candidate at depth 1,
``(0, 1)`` = the second candidate after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (children of the root have depth 1).

    Raises:
        ValueError: a parent that does not come before its child.
    """
    d: list[int] = []
    for i, p in enumerate(parents):
        if p >= i or p < -1:
            raise ValueError(f"node {i} has parent {p}: parents must come before children")
        d.append(1 if p < 0 else d[p] + 1)
    return d


def ancestor_matrix(parents: Sequence[int]) -> np.ndarray:
    """Boolean ``[n+1, n+1]``: row i may attend to column j (j is i or an ancestor of i).

    Row/column 0 is the root (the last committed token); node k is row k+1.
    """
    n = len(parents)
    m = np.zeros((n + 1, n + 1), dtype=bool)
    m[0, 0] = True
    for i, p in enumerate(parents):
        r = i + 1
        m[r] = m[p + 1]
        m[r, r] = True
    return m


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Children of each node, in node order; key -1 is the root."""
    ch: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        ch.setdefault(p, []).append(i)
        ch.setdefault(i, [])
    return ch


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Nodes from the root's child down to ``node`` (inclusive)."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def spine(parents: Sequence[int]) -> list[int]:
    """The chain of first children from the root: the nodes laid out first (the most likely path)."""
    ch = children(parents)
    out, u = [], -1
    while ch.get(u):
        u = ch[u][0]
        out.append(u)
    return out


def choices_to_parents(choices: Sequence[Sequence[int]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """Medusa-style choices -> (parents, the choice path of each node), sorted breadth-first.

    Raises:
        ValueError: a choice whose prefix is not itself a choice.
    """
    paths = sorted({tuple(c) for c in choices if len(c)}, key=lambda c: (len(c), c))
    index = {p: i for i, p in enumerate(paths)}
    parents = []
    for p in paths:
        if len(p) == 1:
            parents.append(-1)
        elif p[:-1] in index:
            parents.append(index[p[:-1]])
        else:
            raise ValueError(f"tree choice {p} has no parent {p[:-1]}")
    return parents, paths


#: A static tree (Medusa's choices notation): 3 candidates for the next token,
#: the chain of top-1 candidates down to depth 5, and second guesses early on.
DEFAULT_TREE_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,),
    (0, 0), (0, 1), (1, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0),
    (0, 0, 0, 0), (0, 0, 0, 0, 0),
)


@dataclass
class TreeLayout:
    """A tree's tokens in verification order (spine first) with its parents and depths."""

    tokens: list[int]
    parents: list[int]

    @property
    def depths(self) -> list[int]:
        return depths(self.parents)


def spine_first(tokens: Sequence[int], parents: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Reorder nodes depth-first with first children first, so the spine occupies the first slots.

    Returns (tokens, parents, old index of each new node). A backend that lays
    the nodes out in this order keeps the spine contiguous after the context.
    """
    ch = children(parents)
    order: list[int] = []
    stack = list(reversed(ch[-1]))
    while stack:
        u = stack.pop()
        order.append(u)
        stack.extend(reversed(ch[u]))
    new_of = {old: new for new, old in enumerate(order)}
    return (
        [int(tokens[o]) for o in order],
        [(-1 if parents[o] < 0 else new_of[parents[o]]) for o in order],
        order,
    )
