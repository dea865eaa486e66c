"""Which drafted tokens a step verifies: a chain's length, a token tree's nodes and their layout.

The adaptive policy keeps the tokens whose expected gain pays for their verification cost
(:func:`~speculative.cost_model.choose_draft_length`; for trees the EAGLE-2 re-ranking of
Li et al. 2024, section 4, :func:`~speculative.cost_model.choose_tree_nodes`); the fixed
policy (no cost model) verifies everything the drafter proposed. The backend's limits
come last: llama.cpp's exact numerics verify nothing past an off-spine node, and its
context gives each leaf's path a sequence id.
"""

from __future__ import annotations

from collections.abc import Sequence

from .cost_model import CostModel, choose_draft_length, choose_tree_nodes
from .drafters.base import DraftProposal
from .trees import depths as tree_depths
from .trees import spine, spine_first


def chain_length(proposal: DraftProposal, cost: CostModel | None, rate: float) -> int:
    """How many leading tokens of a chain draft to verify: all of them (fixed policy, no ``cost``),
    or those worth their verification cost at ``rate`` tokens/s (adaptive).

    A sampled draft (``proposal.probs`` set: x_i ~ q_i) is verified whole: choosing the
    length from the drafted tokens' own confidences would make which positions are
    verified depend on the random draft, and rejection sampling is exact only averaged
    over every x ~ q (e.g. p = (1/2, 1/2), q = (0.9, 0.1), "verify x only if q(x) >= 1/2"
    emits the first token with probability 0.55). The drafter's own early stop is still
    allowed: it decides after each drafted token whether to go on, and every token it
    returns is verified, so the stopping rule only ever depends on verified tokens.
    """
    if cost is None or proposal.confidence is None or not proposal.tokens or proposal.probs is not None:
        return len(proposal.tokens)
    return choose_draft_length(proposal.confidence[: len(proposal.tokens)], cost, rate)


def tree_nodes(proposal: DraftProposal, cost: CostModel | None, rate: float, *, spine_only: bool = False,
               max_leaves: int = 0) -> list[int]:
    """The nodes of a tree draft to verify (indices into the proposal, ancestors included, sorted).

    Args:
        proposal: a tree proposal (``parents`` set).
        cost: the verification cost model; None verifies every node (fixed policy).
        rate: the request's tokens/s, for the adaptive policy.
        spine_only: only the spine and its direct children can be verified (llama.cpp exact numerics).
        max_leaves: the backend's leaf capacity (0: no limit); see :func:`fit_leaves`.
    """
    n = len(proposal.tokens)
    allowed = None
    if spine_only:  # nothing past an off-spine node can be verified
        _, sp_parents, order = spine_first(proposal.tokens, proposal.parents)
        sp_orig = {order[i] for i in spine(sp_parents)}
        allowed = [i for i, p in enumerate(proposal.parents) if p < 0 or p in sp_orig]
    if cost is None or proposal.confidence is None or not n:
        nodes = list(range(n)) if allowed is None else sorted(allowed)
    else:
        nodes = choose_tree_nodes(proposal.parents, proposal.confidence[:n], cost, rate, allowed=allowed)
    return fit_leaves(nodes, proposal.parents, proposal.confidence, max_leaves)


def layout_tree(proposal: DraftProposal, nodes: Sequence[int], *, spine_only: bool = False):
    """The selected ``nodes`` laid out for one forward pass, spine first.

    Returns:
        (tokens, parents, orig): the laid-out tokens, their parents (indices into the
        layout, -1 for the root's children) and each one's index in the proposal.
    """
    nodes = [int(i) for i in nodes]
    keep = {old: new for new, old in enumerate(nodes)}
    toks = [proposal.tokens[i] for i in nodes]
    parents = [keep[proposal.parents[i]] if proposal.parents[i] >= 0 else -1 for i in nodes]
    toks, parents, order = spine_first(toks, parents)
    orig = [nodes[o] for o in order]  # proposal index of each laid-out node
    if spine_only:
        toks, parents, orig = prune_off_spine(toks, parents, orig)
    return toks, parents, orig


def limit_to_budget(p: DraftProposal, budget: int) -> DraftProposal:
    """A proposal cut to the step's budget: a chain's first ``budget`` tokens, a tree's nodes at depth
    <= ``budget`` (no more can be accepted); token ids as Python ints."""
    if p.parents is None:
        p.tokens = [int(t) for t in p.tokens[:budget]]
        return p
    return limit_depth(p, budget)


def limit_depth(p: DraftProposal, max_depth: int) -> DraftProposal:
    """A tree proposal without the nodes deeper than ``max_depth`` (at most that many can be accepted)."""
    d = tree_depths(p.parents)
    keep = [i for i in range(len(p.tokens)) if d[i] <= max_depth]
    if len(keep) == len(p.tokens):
        p.tokens = [int(t) for t in p.tokens]
        return p
    new = {old: n for n, old in enumerate(keep)}
    return DraftProposal(
        tokens=[int(p.tokens[i]) for i in keep],
        probs=p.probs[keep] if p.probs is not None else None,
        confidence=[p.confidence[i] for i in keep] if p.confidence is not None else None,
        parents=[(-1 if p.parents[i] < 0 else new[p.parents[i]]) for i in keep],
    )


def fit_leaves(nodes: list[int], parents: list[int], confidence: list[float] | None, max_leaves: int) -> list[int]:
    """The selected tree ``nodes`` (indices into the proposal, ancestors included) cut to at most
    ``max_leaves`` leaves (0: no limit), the backend's capacity (llama.cpp gives each leaf's path a
    sequence id): the least confident leaf goes first (the last one without confidences), until it fits."""
    if not max_leaves or not nodes:
        return nodes
    kept = set(nodes)
    while True:
        has_child = {parents[i] for i in kept if parents[i] >= 0}
        leaves = [i for i in kept if i not in has_child]
        if len(leaves) <= max_leaves:
            return sorted(kept)
        worst = min(leaves, key=lambda i: (confidence[i] if confidence is not None else 0.0, -i))
        kept.discard(worst)


def prune_off_spine(toks: list[int], parents: list[int], orig: list[int]):
    """Keep the spine and its direct siblings: nodes whose parent is the root or on the spine.

    For backends whose off-spine logits are not bitwise those of plain decoding
    (llama.cpp's exact numerics), a node off the spine may be accepted, but nothing
    is verified past it.
    """
    sp = set(spine(parents))
    keep = [i for i, p in enumerate(parents) if p < 0 or p in sp]
    new = {old: n for n, old in enumerate(keep)}
    return [toks[i] for i in keep], [(-1 if parents[i] < 0 else new[parents[i]]) for i in keep], [orig[i] for i in keep]
