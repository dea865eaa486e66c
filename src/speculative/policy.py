"""The adaptive draft policy: when to draft, how many draft tokens to verify, and when a drafter that
does not pay backs off, falls silent or is measured again.

One :class:`DraftPolicy` per drafter and tenant, kept across requests (the generator holds them:
:meth:`~speculative.engine.SpeculativeGenerator.policy_for`), sharing one :class:`DrafterTimings` (what the
drafter's machine measured, not a tenant's text); each request keeps a :class:`PolicyState`. A request
consults it at five points:

* :meth:`DraftPolicy.begin_request`: the request starts; a silenced drafter sits it out.
* :meth:`DraftPolicy.draft_budget`: before a proposal, how many tokens the drafter may propose
  (0: a plain step, the drafter does not run).
* :meth:`DraftPolicy.choose`: what of the proposal to verify (a chain's length, a tree's nodes).
* :meth:`DraftPolicy.observe_proposal` and :meth:`DraftPolicy.observe_step`: what the proposal
  and the verification cost and yielded.
* :meth:`DraftPolicy.end_request`.

Throughput model (Leviathan et al. 2023, section 3.4, with the measured target cost T(n) of
:mod:`speculative.cost_model` in place of their constant cost ratio): a step that verifies m draft
tokens costs m·t_d + T(m + 1) seconds and yields 1 + sum_i prod_{j<=i} c_j tokens, c_j being the
calibrated acceptance estimates of the draft (:mod:`speculative.drafters.calibration`). The policy
maximizes tokens - r·seconds, r being the request's own long-run rate (tokens/s, at least plain
decoding's 1/T(1)): the renewal-reward form of throughput maximization.

A drafter that does not pay, one mechanism. After every step in which the drafter ran, the policy
judges whether it paid: its measured net saving, accepted·T(1) - (drafting time + the verification's
time beyond T(1)), folded into the drafter's running average (a mean over about the last 20 drafted
steps, :data:`SAVING_WEIGHT`), is not negative. Where the step was not timed alone (a server batch), a
drafter that runs a network for each proposal is judged instead by whether its first token was worth
verifying; so is such a drafter whose proposal came back empty. A step that did not pay
doubles the number of steps the request then decodes plainly (1, 2, 4, ... at most
:data:`MAX_SKIP`); one that paid resets it. Across a tenant's requests the drafter is silenced once its loss
is sure: while the upper confidence bound of the mean saving of every drafted step since it was last
(re)measured is not positive (:meth:`DraftPolicy.saving_bound`), new requests decode plainly from the start (no
drafter state, no hidden states, no proposal: the drafter costs nothing), until 1% (:data:`REMEASURE_BUDGET`) of
the decoding time they sat out covers what the last measurement lost; then the measurement is forgotten and the
next request measures the drafter afresh. A drafter that cannot pay so costs almost nothing, and a
workload that changes (code after translations) is noticed.

Errors: none raised; the policy only ever turns drafting down, never changes what is emitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cost_model import CostModel, cached_verify_cost, drafting_gain_per_token
from .drafters.base import DraftProposal, Drafter, DraftState
from .selection import chain_length, tree_nodes
from .stats import GenerationStats

#: the share of the decoding time a losing drafter sat out (:attr:`DraftPolicy.losing`) that measuring it again may cost
#: (:meth:`DraftPolicy.begin_request`): an exploration budget, like an epsilon-greedy rate
REMEASURE_BUDGET = 0.01
#: most plain steps a request decodes after consecutive steps in which drafting did not pay
MAX_SKIP = 32
#: the weight of a drafted step in the running average of the measured saving, once that average holds
#: 1 / SAVING_WEIGHT steps (an exact mean before): about the last 20 drafted steps
SAVING_WEIGHT = 0.05
#: how sure a measured loss must be before it silences a drafter across requests: the one-sided normal quantile
#: of the mean saving's upper confidence bound (1.645: 95%). A drafted step's saving is skewed (a few ms lost most of
#: the time, a whole T(1) gained when a token is accepted), so a few unlucky steps make a negative average that
#: says little; the bound waits for the evidence (docs/policy.md, "Silencing needs a sure loss")
SILENCE_Z = 1.645
#: the weight, in drafted steps, of the prior on the spread of a step's saving (standard deviation T(1)/2), so
#: that a few steps that all lost alike do not look certain
PRIOR_STEPS = 2
#: catch-up forwards at least this long refine the measured catch-up rate (shorter ones are noisy)
MIN_CATCHUP_TOKENS = 32


@dataclass
class PolicyState:
    """The policy's state for one request (made by :meth:`DraftPolicy.begin_request`).

    Attributes:
        cost: the target's verification cost T(n); None under the fixed policy, which verifies every
            draft token and never backs off.
        k: the most draft tokens a step verifies.
        max_new_tokens: the request's output budget (tokens).
        silent: the drafter sits this request out (silenced when it started): every step is plain.
        remeasures: this request measures the drafter afresh (its last measurement was forgotten).
        draft_cost: seconds per draft token: the drafter's prior estimate, refined by this request's
            proposals (exponential average, weight 0.1).
        skip: plain steps left before the drafter may run again (back-off).
        misses: consecutive steps in which drafting did not pay.
        drafted_s: seconds the drafter ran for this step's proposal (0: it proposed nothing).
        first_ok: whether this step's first draft token was worth verifying (None: not judged; only
            drafters that run a network are).
    """

    cost: CostModel | None
    k: int
    max_new_tokens: int
    silent: bool = False
    remeasures: bool = False
    draft_cost: float = 0.0
    skip: int = 0
    misses: int = 0
    drafted_s: float = 0.0
    first_ok: bool | None = None


@dataclass
class DrafterTimings:
    """What a drafter costs on this machine, shared by its tenants' policies (a hardware measurement: no
    tenant's text is in it).

    Attributes:
        draft_cost_prior: seconds per draft token before any drafting: the draft model's own T(1), measured
            once per machine and cached (None: not measured yet, or the drafter has no model).
        catchup_rate: measured seconds per token of the drafter's catch-up forwards (None: not yet).
    """

    draft_cost_prior: float | None = None
    catchup_rate: float | None = None


def _student_t(z: float, dof: float) -> float:
    """The quantile of Student's t with ``dof`` degrees of freedom at the normal quantile ``z``: the expansion of
    Abramowitz and Stegun 26.7.5 to 1/dof⁴. For z = 1.645 (95%) it gives 6.01 at 1 degree (exact 6.31), 2.91 at 2
    (2.92) and is within 0.1% from 3. Infinite below 1 degree."""
    if dof < 1.0:
        return math.inf
    z3, z5, z7, z9 = z**3, z**5, z**7, z**9
    g1 = (z3 + z) / 4.0
    g2 = (5.0 * z5 + 16.0 * z3 + 3.0 * z) / 96.0
    g3 = (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / 384.0
    g4 = (79.0 * z9 + 776.0 * z7 + 1482.0 * z5 - 1920.0 * z3 - 945.0 * z) / 92160.0
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4


class DraftPolicy:
    """The adaptive draft policy of one drafter, and what it has measured of it across requests.

    Args:
        drafter: the drafter it decides for.
        timings: the drafter's :class:`DrafterTimings`, shared with its other tenants' policies (None: its own).

    Attributes:
        draft_cost_prior, catchup_rate: those of :attr:`timings`.
        accepts, rejects: accepted draft tokens and rejected drafts over every verified draft.
        saving: average measured net saving of a drafted step, seconds (None: not measured).
        saving_steps: drafted steps in that average since it was last (re)measured.
        saving_scale: the target's T(1) when the last saving was measured, seconds (the prior's scale).
        step_tokens: average tokens a drafted step yielded.
        measure_net: net seconds its drafted steps saved since the saving was last (re)measured (their sum).
        measure_sq: the sum of their squares, seconds² (their spread, for :meth:`saving_bound`).
        silent_s: decoding seconds of the requests it sat out while :attr:`losing`, since then.
    """

    def __init__(self, drafter: Drafter, timings: DrafterTimings | None = None):
        self.drafter = drafter
        self.timings = timings if timings is not None else DrafterTimings()
        self.accepts = 0
        self.rejects = 0
        self.saving: float | None = None
        self.saving_scale = 0.0
        self.saving_steps = 0
        self.step_tokens = 1.0
        self.measure_net = 0.0
        self.measure_sq = 0.0
        self.silent_s = 0.0

    # ---- what is known of the drafter -------------------------------------------------------------

    @property
    def draft_cost_prior(self) -> float | None:
        return self.timings.draft_cost_prior

    @draft_cost_prior.setter
    def draft_cost_prior(self, seconds: float | None) -> None:
        self.timings.draft_cost_prior = seconds

    @property
    def catchup_rate(self) -> float | None:
        return self.timings.catchup_rate

    @catchup_rate.setter
    def catchup_rate(self, seconds: float | None) -> None:
        self.timings.catchup_rate = seconds

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance rate alpha over this drafter's verified drafts so far.

        The geometric-acceptance estimate: accepted / (accepted + rejections), a rejection being the
        first refused token of a draft (tokens after it are never reached), with an optimistic prior of
        4 accepted and 1 rejected token (alpha 0.8) that the first few steps outweigh: a new drafter
        gets to draft, and so to be measured.
        """
        return (self.accepts + 4.0) / (self.accepts + self.rejects + 5.0)

    def saving_bound(self) -> float:
        """Upper confidence bound of the mean saving of a drafted step since the drafter was last (re)measured,
        seconds: the mean of those n steps plus a quantile of Student's t with n - 1 degrees of freedom at
        :data:`SILENCE_Z` times its standard error. The steps' sample variance is pooled with a prior of
        :data:`PRIOR_STEPS` steps of standard deviation T(1)/2, so that a few steps that lost alike do not look
        certain; the prior adds no degrees of freedom. Infinite before 2 steps (one says nothing of the spread).
        Every step since the last (re)measure counts, so a small loss is found sure in time, however noisy."""
        n = self.saving_steps
        if self.saving is None or n < 2:
            return math.inf
        mean = self.measure_net / n
        sample_var = max(0.0, self.measure_sq - n * mean * mean) / (n - 1)
        var = ((n - 1) * sample_var + PRIOR_STEPS * (self.saving_scale / 2.0) ** 2) / (n - 1 + PRIOR_STEPS)
        return mean + _student_t(SILENCE_Z, n - 1.0) * math.sqrt(var / n)

    @property
    def silenced(self) -> bool:
        """True while the measured saving is surely not positive (:meth:`saving_bound` <= 0): the drafter
        sits out new requests until it is measured again."""
        return self.saving_bound() <= 0.0

    def draft_cost_estimate(self) -> float | None:
        """Seconds per draft token before any drafting: the draft model's T(1), measured on this machine
        once and cached (:func:`~speculative.cost_model.cached_verify_cost`); None without a draft model."""
        if self.draft_cost_prior is None and self.drafter.model is not None:
            self.draft_cost_prior = cached_verify_cost(self.drafter.model).time(1)
        return self.draft_cost_prior

    def measured_saving_per_token(self) -> float | None:
        """Seconds saved per generated token while drafting, as measured over recent drafted steps
        (their average net saving over their average tokens); None before any was measured."""
        if self.saving is None:
            return None
        return self.saving / max(1.0, self.step_tokens)

    def observe_saving(self, seconds: float, tokens: int, scale: float) -> float:
        """Fold one drafted step's measured net saving (seconds; negative: it cost more than it saved)
        and the tokens it yielded into the running averages and the sums since the last (re)measure; returns
        the average saving. ``scale``: the target's T(1), seconds (the scale of the prior on the spread).

        The averages are exact means over the first 1 / :data:`SAVING_WEIGHT` steps since the saving was
        (re)measured, exponential with that weight after. A step's saving is skewed (a head's steps lose
        a few ms most of the time and gain a whole T(1) when a token is accepted: median -2.6 ms, mean
        +13.7 ms on 10 development prompts, docs/bench/head-policy-zen4), so a short average keeps dipping
        below 0 while drafting pays, and each dip backs off."""
        self.measure_net += seconds
        self.measure_sq += seconds * seconds
        self.saving_steps = 1 if self.saving is None else self.saving_steps + 1
        w = max(1.0 / self.saving_steps, SAVING_WEIGHT)
        self.saving_scale = scale
        if self.saving is None:
            self.saving, self.step_tokens = seconds, float(tokens)
        else:
            self.saving += w * (seconds - self.saving)
            self.step_tokens += w * (tokens - self.step_tokens)
        return self.saving

    # ---- a request's start and end ------------------------------------------------------------------

    @property
    def losing(self) -> bool:
        """Silenced, or its recent drafted steps lost on average (the running average is not positive): either
        way the drafter drafts little or nothing, so the time it sits out counts towards measuring it afresh."""
        return self.silenced or (self.saving is not None and self.saving <= 0.0)

    def begin_request(self, cost: CostModel | None, k: int, max_new_tokens: int) -> PolicyState:
        """A request starts: under the adaptive policy (``cost`` given) a silenced drafter sits it out,
        unless the decoding time of the requests a :attr:`losing` drafter sat out, times
        :data:`REMEASURE_BUDGET`, now covers what its last measurement lost (its drafted steps' net saving,
        catch-up included): then the measurement is forgotten and this request measures it afresh. Measuring
        again so costs at most that share of the time spent silent, and a costly probe is repeated rarely, a
        cheap one soon. (A drafter whose recent steps lost but whose loss is not sure drafts on, throttled by
        the back-off; one that then cannot draft at all, such as a draft model whose catch-up no longer pays,
        is measured afresh the same way rather than kept waiting.)"""
        st = PolicyState(cost, k, max_new_tokens)
        if cost is None:
            return st
        st.draft_cost = self.draft_cost_estimate() or 0.0
        if not self.losing:
            self.silent_s = 0.0
        elif self.silent_s * REMEASURE_BUDGET >= -self.measure_net:
            self.saving, self.saving_steps, self.step_tokens = None, 0, 1.0
            self.measure_net = self.measure_sq = self.silent_s = 0.0
            st.remeasures = True
        st.silent = self.silenced
        return st

    def end_request(self, st: PolicyState, decode_s: float, drafted: bool) -> None:
        """A request ended after ``decode_s`` seconds of decoding (prefill excluded); ``drafted``: some of
        its drafts were verified. Time sat out while :attr:`losing` counts towards the next re-measure. A
        cost table that drifted is written back to its cache."""
        if st.cost is None:
            return
        if not drafted and self.losing:
            self.silent_s += max(0.0, decode_s)
        st.cost.save_if_drifted()

    # ---- one step ---------------------------------------------------------------------------------------

    def rate(self, st: PolicyState, stats: GenerationStats) -> float:
        """Long-run tokens/s the request achieves so far (at least plain decoding's 1/T(1))."""
        decode_s = stats.wall_time_s - stats.prefill_time_s
        return max(1.0 / st.cost.time(1), (stats.new_tokens - 1) / decode_s if decode_s > 0 else 0.0)

    def draft_budget(self, st: PolicyState, m_max: int, stats: GenerationStats, state: DraftState | None,
                     context: Sequence[int]) -> int:
        """How many tokens the drafter may propose this step: ``m_max`` (the request's room), or 0 for a
        plain step, in which the drafter does not run: the request sits out, no draft length could pay
        (:meth:`can_pay`), catching the drafter up would not pay yet (:meth:`afford_catchup`), or the
        request is backing off (see the module docstring)."""
        if st.cost is None or m_max <= 0:
            return max(0, m_max)
        if st.silent or not self.can_pay(st, m_max, self.rate(st, stats)):
            return 0
        if not self.afford_catchup(st, stats, state, context):
            return 0
        if st.skip > 0:
            st.skip -= 1
            return 0
        return m_max

    def min_confidence(self, st: PolicyState, stats: GenerationStats) -> float:
        """What one more draft token costs, on average over k, in tokens at the request's rate (0 under the
        fixed policy): a drafter stops once the next token is expected to add less
        (:meth:`~speculative.drafters.calibration.AcceptanceCalibration.worth_drafting`)."""
        if st.cost is None:
            return 0.0
        t1 = st.cost.time(1)
        return self.rate(st, stats) * ((st.cost.time(st.k + 1) - t1) / st.k + st.draft_cost)

    def can_pay(self, st: PolicyState, m_max: int, rate: float) -> bool:
        """Whether drafting could beat plain decoding this step even if every draft token were accepted.

        With the verification cost T(n), the drafter's cost per token t_d and the request's rate r,
        m perfectly accepted draft tokens score (m + 1) - r·(m·t_d + T(m + 1)) against plain decoding's
        1 - r·T(1). When no m <= ``m_max`` wins, the drafter does not run, so a drafter that costs a
        large share of a target step (a same-family draft model on a compute-bound CPU) costs nothing;
        on hardware where T(n) is flat the same test drafts.
        """
        cost, td = st.cost, st.draft_cost
        base = 1.0 - rate * cost.time(1)
        return any((m + 1) - rate * (m * td + cost.time(m + 1)) > base for m in range(1, m_max + 1))

    def afford_catchup(self, st: PolicyState, stats: GenerationStats, state: DraftState | None,
                       context: Sequence[int]) -> bool:
        """Before a draft that needs the drafter to catch up on many tokens (a draft model's lazy prompt
        prefill): whether, and on how much of the context, catching up pays now.

        Drafting saves g seconds per generated token (:func:`~speculative.cost_model.drafting_gain_per_token`
        at the measured acceptance rate, draft cost and T(n), and at most what recent drafted steps
        measurably saved per token: the acceptance of the drafts the policy chose to verify flatters the
        drafter); catching up costs t_c per token (the measured rate; before the first catch-up, the
        target's measured prefill rate scaled by the two models' T(1)). The context the drafter reads is
        capped at the last R·g/(2·t_c) tokens, R being the tokens left in the budget (drafts stay
        verified, so the output is unchanged); fewer than 64: no drafting. The answer's length is
        unknown, so the catch-up is bought as in ski rental (Karlin et al. 1988): decode plainly until
        drafting would already have saved its cost, i.e. until (tokens generated)·g >= (window)·t_c,
        which loses at most twice what knowing the length in advance would.
        """
        d = self.drafter
        n = d.catchup_tokens(state, context)
        if n <= 0:
            return True
        t_c = self.catchup_rate
        if t_c is None:
            t1 = st.cost.time(1)
            fresh = stats.prompt_tokens - stats.cached_prompt_tokens
            target_rate = stats.prefill_time_s / fresh if fresh >= 32 else st.cost.time(16) / 16
            t_c = target_rate * min(1.0, (self.draft_cost_estimate() or t1) / t1)
        g = drafting_gain_per_token(self.acceptance_rate, st.draft_cost, st.cost, st.k)
        real = self.measured_saving_per_token()
        if real is not None:
            g = min(g, max(0.0, real))
        left = st.max_new_tokens - stats.new_tokens
        window = min(n, int(left * g / (2.0 * t_c))) if t_c > 0 else n
        if window < min(n, 64) or stats.new_tokens * g < window * t_c:
            return False
        if window < n:
            d.limit_context(state, context, window)
        return True

    def choose(self, st: PolicyState, proposal: DraftProposal, stats: GenerationStats, *,
               spine_only: bool = False, max_leaves: int = 0) -> int | list[int]:
        """What to verify of a proposal: a chain's length (:func:`~speculative.selection.chain_length`) or
        a tree's nodes (:func:`~speculative.selection.tree_nodes`); everything under the fixed policy."""
        rate = self.rate(st, stats) if st.cost is not None else 0.0
        if proposal.parents is None:
            return chain_length(proposal, st.cost, rate)
        return tree_nodes(proposal, st.cost, rate, spine_only=spine_only, max_leaves=max_leaves)

    def observe_proposal(self, st: PolicyState, proposal: DraftProposal, seconds: float, budget: int,
                         min_confidence: float) -> None:
        """The drafter ran ``seconds`` for ``proposal`` (asked for at most ``budget`` tokens): its cost per
        draft token (catch-up left out), its catch-up rate, and whether its first token was worth verifying."""
        st.drafted_s = seconds if proposal.tokens else 0.0
        n, cs = proposal.catchup_tokens, proposal.catchup_s
        if n >= MIN_CATCHUP_TOKENS and cs > 0:
            old = self.catchup_rate
            self.catchup_rate = cs / n if old is None else old + 0.3 * (cs / n - old)
        if proposal.tokens:
            per_token = max(seconds - cs, 0.0) / min(len(proposal.tokens), budget)
            st.draft_cost += 0.1 * (per_token - st.draft_cost)
        st.first_ok = None
        if budget > 0 and self.drafter.runs_network and st.cost is not None:
            first = proposal.confidence[0] if proposal.confidence else None
            st.first_ok = min_confidence <= 0 or (first is not None and first >= min_confidence)

    def observe_step(self, st: PolicyState, verified: int, accepted: int, fed: int, forward_s: float | None,
                     emitted: int | None = None) -> None:
        """A verification: ``verified`` draft tokens (a chain, or a tree's depth), ``accepted`` of them, in a
        target forward of ``fed`` tokens that took ``forward_s`` seconds (None: not timed alone, in a
        batch), emitting ``emitted`` tokens (default ``accepted + 1``: the accepted ones and the next; a
        tree path that ends off the spine on llama.cpp's exact numerics emits no next token). Refines
        T(n), the acceptance rate and the measured saving, and backs off when the step did not pay (see
        the module docstring)."""
        emitted = accepted + 1 if emitted is None else emitted
        if verified > 0:
            self.accepts += accepted
            self.rejects += 1 if accepted < verified else 0
        if st.cost is None:
            return
        if forward_s is not None:
            st.cost.update(fed, forward_s)
        paid = st.first_ok
        if st.drafted_s > 0.0 and forward_s is not None:
            t1 = st.cost.time(1)
            # the verification's time beyond T(1), unclipped: forwards jitter both ways, and clipping at 0
            # would charge every draft the jitter's upper half
            saving = self.observe_saving((emitted - 1) * t1 - st.drafted_s - (forward_s - t1), emitted, t1)
            paid = saving >= 0.0  # the first token's test only where the step was not timed (a batch)
        st.drafted_s, st.first_ok = 0.0, None
        if paid is True:
            st.misses = 0
        elif paid is False:
            st.misses += 1
            st.skip = min(2 ** (st.misses - 1), MAX_SKIP)
