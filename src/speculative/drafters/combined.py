"""Two drafters, one step: the suffix drafter's match where it is long and confident, another drafter
(a draft model, a head) otherwise (``--drafter suffix+model:NAME``).

SuffixDecoding's hybrid mode (Oliaro et al. 2025, section 4.4; Arctic Inference runs it beside its
speculator) compares, per step, the suffix tree's score with what the model drafter is expected to
yield and keeps the better one. Here each step first asks the suffix drafter (microseconds); when
the expected number of accepted tokens of its chain (the sum over its prefixes of the product of the
calibrated acceptance estimates) reaches what the other drafter's proposals have been accepted for
on average in this request (at least ``min_expected``), the suffix proposal is verified and the
other drafter does not run; else the other drafter proposes. Either way one proposal is verified, so
output is unchanged. The choice is counted per drafter (:attr:`CombinedState.chosen`, and the
request's statistics ``drafter_steps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .base import DraftProposal, DraftState, Drafter
from .suffix import SuffixDrafter


@dataclass
class CombinedState(DraftState):
    suffix: DraftState | None = None
    other: DraftState | None = None
    chosen: dict[str, int] = field(default_factory=dict)  # drafter kind -> steps it proposed
    last: str = ""  # which drafter proposed last
    last_tokens: list[int] = field(default_factory=list)  # its chain, to see how much was accepted
    last_at: int = 0  # the context length it followed
    other_accepted: float = -1.0  # running mean of the other drafter's accepted tokens (-1: none yet)


def expected_accepted(confidence: Sequence[float]) -> float:
    """Sum over prefixes of the product of acceptance estimates: the expected accepted draft tokens."""
    total, run = 0.0, 1.0
    for c in confidence:
        run *= max(0.0, min(1.0, c))
        total += run
    return total


class CombinedDrafter(Drafter):
    """``suffix[,...]+OTHER``: the suffix drafter where its match is confident, ``other`` elsewhere.

    Args:
        suffix: the suffix drafter.
        other: any drafter (draft model, head, n-gram).
        min_expected: the suffix proposal is taken when its expected accepted tokens reach at least this,
            and at least the other drafter's measured mean.
    """

    kind = "suffix+"

    def __init__(self, suffix: SuffixDrafter, other: Drafter, min_expected: float = 1.5):
        super().__init__()
        self.suffix, self.other = suffix, other
        self.min_expected = float(min_expected)
        self.needs_hidden = other.needs_hidden
        self.hidden_window = other.hidden_window
        self.hidden_layers = other.hidden_layers
        self.steerable = other.steerable and suffix.steerable
        self.runs_network = other.runs_network
        self.model = other.model
        self.kind = f"suffix+{other.kind}"

    @property
    def description(self) -> str:
        return f"{self.suffix.description}+{self.other.description}"

    def non_embedding_parameters(self):
        return self.other.non_embedding_parameters()

    def bind(self, target) -> None:
        super().bind(target)
        self.suffix.bind(target)
        if self.other.target is not target:
            self.other.bind(target)

    def warm_up(self) -> None:
        """Warm the other drafter (a head warms up once, so the one :func:`~speculative.drafters.build_drafter`
        already warmed does nothing again); the suffix drafter runs no network."""
        self.other.warm_up()

    def start(self, prompt, messages=None, tenant: str = "") -> CombinedState:
        return CombinedState(prompt_len=len(prompt), suffix=self.suffix.start(prompt, messages, tenant=tenant),
                             other=self.other.start(prompt, messages, tenant=tenant))

    def _learn(self, st: CombinedState, context: Sequence[int]) -> None:
        """How many of the other drafter's last chain tokens the committed context confirms."""
        if st.last != "other" or not st.last_tokens:
            return
        got = 0
        for i, t in enumerate(st.last_tokens):
            if st.last_at + i >= len(context) or context[st.last_at + i] != t:
                break
            got += 1
        st.other_accepted = got if st.other_accepted < 0 else st.other_accepted + 0.2 * (got - st.other_accepted)
        st.last = ""

    def propose(self, state, context, max_tokens, sampler, rng, min_confidence=0.0, guide=None) -> DraftProposal:
        self._learn(state, context)
        p = self.suffix.propose(state.suffix, context, max_tokens, sampler, rng, min_confidence, guide)
        conf = p.confidence or []
        if p.parents is not None:  # a tree: judge its spine
            spine, u = [], -1
            for i, par in enumerate(p.parents):
                if par == u:
                    spine.append(conf[i])
                    u = i
            conf = spine
        bar = max(self.min_expected, state.other_accepted)
        if p.tokens and expected_accepted(conf) >= bar:
            state.chosen["suffix"] = state.chosen.get("suffix", 0) + 1
            p.source = "suffix"
            return p
        q = self.other.propose(state.other, context, max_tokens, sampler, rng, min_confidence, guide)
        if q.tokens:
            state.chosen[self.other.kind] = state.chosen.get(self.other.kind, 0) + 1
            state.last, state.last_at = "other", len(context)
            state.last_tokens = list(q.tokens) if q.parents is None else []
        q.source = self.other.kind
        return q

    def observe_hidden(self, state, start, hidden) -> None:
        self.other.observe_hidden(state.other, start, hidden)

    def catchup_tokens(self, state, context) -> int:
        return self.other.catchup_tokens(state.other, context)

    def limit_context(self, state, context, n_tokens) -> None:
        self.other.limit_context(state.other, context, n_tokens)

    def finish(self, state, context=None) -> None:
        self.suffix.finish(state.suffix, context)
        self.other.finish(state.other, context)

    def reset_caches(self) -> None:
        self.suffix.reset_caches()
        self.other.reset_caches()

    def close(self) -> None:
        self.suffix.close()
        self.other.close()
