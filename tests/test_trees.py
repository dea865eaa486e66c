"""Token trees: layout, masks, positions, and lossless multi-candidate verification."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from speculative.sampling import sample_from, softmax
from speculative.trees import (
    DEFAULT_TREE_CHOICES,
    ancestor_matrix,
    choices_to_parents,
    depths,
    path_to,
    spine,
    spine_first,
)
from speculative.verification import TreeVerifyResult, tree_rejection_sample, verify_tree_greedy


pytestmark = pytest.mark.quick

#        root
#       /    \\
#      0(a)   1(b)
#     /  \\     \\
#   2(c) 3(d)   4(e)
#    |
#   5(f)
PARENTS = [-1, -1, 0, 0, 1, 2]


def test_depths_paths_and_mask():
    assert depths(PARENTS) == [1, 1, 2, 2, 2, 3]
    assert path_to(PARENTS, 5) == [0, 2, 5] and spine(PARENTS) == [0, 2, 5]
    m = ancestor_matrix(PARENTS)
    assert m.shape == (7, 7)
    # node 5 (row 6) sees root, 0, 2 and itself
    assert np.nonzero(m[6])[0].tolist() == [0, 1, 3, 6]
    # node 4 (row 5) sees root, 1 and itself, not its cousin 3
    assert np.nonzero(m[5])[0].tolist() == [0, 2, 5]
    assert m[0].tolist() == [True] + [False] * 6
    with pytest.raises(ValueError):
        depths([-1, 2, 0])


def test_choices_and_spine_first_layout():
    parents, paths = choices_to_parents(DEFAULT_TREE_CHOICES)
    assert paths[0] == (0,) and parents[: 3] == [-1, -1, -1]
    assert all(len(paths[i]) == len(paths[p]) + 1 for i, p in enumerate(parents) if p >= 0)
    with pytest.raises(ValueError):
        choices_to_parents([(0, 1)])
    toks = [10, 11, 12, 13, 14, 15]
    t2, p2, order = spine_first(toks, PARENTS)
    assert t2[:3] == [10, 12, 15] and spine(p2) == [0, 1, 2]  # the spine is laid out first
    assert sorted(order) == list(range(6))
    assert [t2[i] for i in path_to(p2, 2)] == [10, 12, 15]


def test_fit_leaves_cuts_the_least_confident_leaves():
    from speculative.selection import fit_leaves as _fit_leaves

    # spine 0 -> 2 -> 4, siblings 1 (of 0), 3 (of 2), 5 (of 4): four leaves (1, 3, 5 and spine end 4)
    parents = [-1, -1, 0, 0, 2, 2]
    conf = [0.9, 0.2, 0.8, 0.3, 0.7, 0.1]
    assert _fit_leaves(list(range(6)), parents, conf, 0) == list(range(6))
    assert _fit_leaves(list(range(6)), parents, conf, 3) == [0, 1, 2, 3, 4]
    assert _fit_leaves(list(range(6)), parents, conf, 2) == [0, 2, 3, 4]
    assert _fit_leaves(list(range(6)), parents, conf, 1) == [0, 2, 4]


def test_greedy_tree_follows_the_target():
    toks = [10, 11, 12, 13, 14, 15]
    choice = {-1: 10, 0: 13, 3: 99}
    assert verify_tree_greedy(lambda u: choice[u], toks, PARENTS) == TreeVerifyResult([0, 3], 99)
    choice = {-1: 11, 1: 14, 4: 7}
    assert verify_tree_greedy(lambda u: choice[u], toks, PARENTS) == TreeVerifyResult([1, 4], 7)
    assert verify_tree_greedy(lambda u: 5, toks, PARENTS) == TreeVerifyResult([], 5)


N = 200_000


def _run(parents, tok_of, p_of, q_of, verifier, rng):
    """Joint counts of the first two emitted tokens; the next step after a 1-token step samples p2."""
    v = p_of(-1, None).shape[0]
    counts = np.zeros((v, v), dtype=np.int64)
    for _ in range(N):
        toks = tok_of(rng)
        res = verifier(lambda u: p_of(u, toks), toks, parents, q_of, rng)
        emitted = [toks[i] for i in res.path] + [res.next_token]
        if len(emitted) < 2:
            emitted.append(sample_from(p_of(-2, [emitted[0]]), rng))
        counts[emitted[0], emitted[1]] += 1
    return counts


def _case(seed=0, v=5):
    rng = np.random.default_rng(seed)
    p1 = softmax(rng.normal(size=v) * 1.3)
    p2 = np.stack([softmax(rng.normal(size=v) * 1.3) for _ in range(v)])  # target after token t
    q1 = softmax(rng.normal(size=v))
    q2 = np.stack([softmax(rng.normal(size=v)) for _ in range(v)])
    return p1, p2, q1, q2


def _pval(counts, expected):
    e = expected.ravel() * counts.sum()
    keep = e > 0
    assert counts.ravel()[~keep].sum() == 0
    return stats.chisquare(counts.ravel()[keep], e[keep]).pvalue


# a tree of depth 2: three candidates for the first token, two for the second after the first candidate
TREE = [-1, -1, -1, 0, 0]


def _p_of(p1, p2):
    def p_of(u, toks):
        if u == -1:
            return p1
        if u == -2:  # the next step's first position, after the emitted token
            return p2[toks[0]]
        # a node's distribution depends on its token (the target conditioned on it)
        return p2[toks[u]]
    return p_of


def test_tree_sampling_deterministic_candidates_is_lossless():
    p1, p2, _, _ = _case()
    rng = np.random.default_rng(11)

    def toks(rng):
        # top-3 guesses of a (wrong) drafter, then its top-2 after the first guess: distinct, deterministic
        return [3, 0, 4, 1, 2]

    counts = _run(TREE, toks, _p_of(p1, p2), None, tree_rejection_sample, rng)
    assert _pval(counts, p1[:, None] * p2) > 1e-3


def test_tree_sampling_iid_candidates_is_lossless():
    p1, p2, q1, q2 = _case(1)
    rng = np.random.default_rng(12)
    state = {}

    def toks(rng):
        a, b, c = (sample_from(q1, rng) for _ in range(3))
        d, e = (sample_from(q2[a], rng) for _ in range(2))
        state["t"] = [a, b, c, d, e]
        return state["t"]

    def q_of(u):
        return q1 if u == -1 else q2[state["t"][u]]

    counts = _run(TREE, toks, _p_of(p1, p2), q_of, tree_rejection_sample, rng)
    assert _pval(counts, p1[:, None] * p2) > 1e-3


def _broken(target_probs, tokens, parents, child_probs, rng):
    """Tries siblings without updating p after a rejection (a classic bug)."""
    from speculative.trees import children

    ch = children(parents)
    u, path = -1, []
    while True:
        p = target_probs(u)
        acc = next((c for c in ch[u] if rng.random() < p[tokens[c]]), None)
        if acc is None:
            return TreeVerifyResult(path, sample_from(p, rng))
        path.append(acc)
        u = acc


def test_tree_statistical_test_detects_a_broken_verifier():
    p1, p2, _, _ = _case()
    counts = _run(TREE, lambda rng: [3, 0, 4, 1, 2], _p_of(p1, p2), None, _broken, np.random.default_rng(11))
    assert _pval(counts, p1[:, None] * p2) < 1e-6
