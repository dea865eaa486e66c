"""The adaptive draft policy (speculative.policy): one back-off for drafters that do not pay, silencing
across requests and the budgeted re-measure, the fixed policy that never backs off."""

from __future__ import annotations

import math

import pytest

from conftest import FrozenCost
from speculative.drafters import NgramDrafter
from speculative.drafters.base import DraftProposal, NoDrafter
from speculative.policy import MAX_SKIP, REMEASURE_BUDGET, DraftPolicy, _student_t
from speculative.stats import GenerationStats

pytestmark = pytest.mark.quick

FLAT = FrozenCost([1, 16], [0.010, 0.010])  # T(n) = 10 ms for any n: drafting can always pay


class NetworkDrafter(NoDrafter):
    """Stands for a drafter that runs a network for each proposal (a draft model, a head)."""

    runs_network = True


def _run(policy, st, steps: int, proposal: DraftProposal, min_confidence: float = 0.5,
         forward_s: float | None = None, accepted: int = 0) -> str:
    """``steps`` steps of one request: 'p' where the drafter ran (with ``proposal``), 's' where it was skipped."""
    stats, pattern = GenerationStats(), []
    for _ in range(steps):
        budget = policy.draft_budget(st, 4, stats, None, [])
        if budget == 0:
            pattern.append("s")
            continue
        pattern.append("p")
        policy.observe_proposal(st, proposal, 0.001, budget, min_confidence)
        policy.observe_step(st, len(proposal.tokens), accepted, 1 + len(proposal.tokens), forward_s)
    return "".join(pattern)


def test_a_drafter_whose_first_token_falls_short_backs_off_1_2_4_then_resets():
    policy = DraftPolicy(NetworkDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    weak = DraftProposal([7], confidence=[0.1])  # not worth verifying at min_confidence 0.5
    assert _run(policy, st, 12, weak) == "pspsspssssps"
    while st.skip:
        _run(policy, st, 1, weak)
    assert _run(policy, st, 1, DraftProposal([7], confidence=[0.9])) == "p"  # a promising proposal resets
    assert st.misses == 0 and st.skip == 0
    assert _run(policy, st, 3, DraftProposal())[:2] == "ps", "an empty proposal of a network drafter is a miss"


def test_the_back_off_is_capped():
    policy = DraftPolicy(NetworkDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    pattern = _run(policy, st, 400, DraftProposal([7], confidence=[0.1]))
    assert max(len(run) for run in pattern.split("p")) == MAX_SKIP == 32


def test_a_measured_loss_backs_off_and_paying_steps_reset():
    """The measured net saving is the same signal for every drafter, a free one included: a drafted step
    that loses (nothing accepted, the verification slower than T(1)) backs off; once the average saving
    is positive again, the back-off resets."""
    policy = DraftPolicy(NgramDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    draft = DraftProposal([7, 8], confidence=[0.9, 0.9])
    assert _run(policy, st, 3, draft, forward_s=0.020, accepted=0) == "psp"
    assert policy.saving < 0 and st.misses == 2
    while st.skip:
        _run(policy, st, 1, draft)
    # accepted 2 of 2 in 11 ms: saves 2 x 10 - 1 - 1 = 18 ms a step; the average (an exact mean over the
    # first 20 drafted steps: -11, -11, then 18s) turns positive at the second such step, the back-off
    # growing until then (4 plain steps)
    pattern = _run(policy, st, 30, draft, forward_s=0.011, accepted=2)
    assert pattern == "p" + "s" * 4 + "p" * 25
    assert policy.saving > 0 and st.misses == 0


def test_a_free_drafter_that_proposes_nothing_is_not_judged():
    policy = DraftPolicy(NgramDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    assert _run(policy, st, 5, DraftProposal(), forward_s=0.010) == "ppppp"


def test_the_fixed_policy_never_backs_off():
    policy = DraftPolicy(NetworkDrafter())
    st = policy.begin_request(None, 4, 1000)
    assert _run(policy, st, 6, DraftProposal([7], confidence=[0.1]), min_confidence=0.0, forward_s=0.02) == "pppppp"
    assert policy.accepts == 0 and policy.rejects == 6  # acceptance is still measured


def test_silenced_drafter_is_remeasured_within_a_budget():
    """A negative measured saving silences a drafter (a request that starts silenced never lets it draft);
    it is measured afresh once the decoding time it sat out, times the budget (1%), covers what the last
    measurement lost; one that pays ends it."""
    assert REMEASURE_BUDGET == 0.01
    p = DraftPolicy(NgramDrafter())

    def begin():
        st = p.begin_request(FLAT, 4, 64)
        assert st.silent == p.silenced and st.silent != st.remeasures or not p.silenced
        if st.silent:
            assert _run(p, st, 3, DraftProposal([7], confidence=[1.0])) == "sss"
        return st

    st = begin()
    assert not st.remeasures and not st.silent  # nothing measured yet: nothing to re-measure
    for _ in range(4):  # the first measurement: four drafted steps that lost 2 s in all, surely
        p.observe_saving(-0.5, 1, 0.010)
    p.end_request(st, 120.0, drafted=True)  # the request that measured it is not sat out
    pattern = []
    for _ in range(6):
        st = begin()
        pattern.append(st.remeasures)
        if not st.remeasures:
            assert st.silent
            p.end_request(st, 45.0, drafted=False)  # each silent request decodes for 45 s
    assert pattern == [False] * 5 + [True]  # after 4 silent requests 180 s x 1% < 2 s; after 5, 225 s
    assert not st.silent and p.measured_saving_per_token() is None  # the old measurement is forgotten
    p.observe_saving(-0.1, 1, 0.010)  # the re-measure loses 0.2 s in two steps: measured again after 20 s sat out
    p.observe_saving(-0.1, 1, 0.010)
    p.end_request(st, 30.0, drafted=True)
    st = begin()
    assert not st.remeasures
    p.end_request(st, 19.0, drafted=False)
    st = begin()
    assert not st.remeasures
    p.end_request(st, 1.0, drafted=False)
    st = begin()
    assert st.remeasures
    p.observe_saving(0.3, 2, 0.010)  # this one pays: the drafter drafts again, nothing to re-measure
    assert p.measured_saving_per_token() == 0.15
    p.end_request(st, 500.0, drafted=True)
    st = begin()
    assert not st.remeasures and not st.silent and p.measured_saving_per_token() == 0.15


def test_a_step_without_a_next_token_saves_one_single_token_step_less():
    """A tree path that ends off the spine (llama.cpp's exact numerics) emits its accepted tokens only: the
    measured saving is one T(1) smaller than that of a step that also emitted the next token."""
    savings = []
    for emitted in (None, 2):
        policy = DraftPolicy(NgramDrafter())
        st = policy.begin_request(FLAT, 4, 1000)
        policy.observe_proposal(st, DraftProposal([7, 8, 9]), 0.001, 4, 0.0)
        policy.observe_step(st, 3, 2, 4, 0.012, emitted=emitted)
        savings.append(policy.saving)
    assert savings[0] == pytest.approx(2 * 0.010 - 0.001 - 0.002)  # 3 tokens for a 12 ms step and 1 ms drafting
    assert savings[0] - savings[1] == pytest.approx(0.010)


def test_a_skewed_saving_that_pays_on_average_does_not_back_off():
    """A head's drafted steps on the Qwen target: most lose a little (the first token rejected: its drafting
    time and the forward's jitter), some gain a whole T(1). Four of five lose 1.5 ms, one gains 8.5 ms: +0.5 ms
    a step on average. The average over about 20 steps stays positive after the first few, so the request
    keeps drafting; a 5-step average (weight 0.2) dipped below 0 after each run of losses and backed off."""
    policy = DraftPolicy(NetworkDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    stats = GenerationStats()
    pattern = []
    for _ in range(200):
        if policy.draft_budget(st, 1, stats, None, []) == 0:
            pattern.append("s")
            continue
        pattern.append("p")
        won = pattern.count("p") % 5 == 0  # every fifth drafted step
        # a weak first token (below the threshold): judged by the timed saving, not by its confidence
        policy.observe_proposal(st, DraftProposal([7], confidence=[0.1]), 0.001, 1, 0.5)
        policy.observe_step(st, 1, 1 if won else 0, 2, 0.0105)
    assert policy.saving > 0
    assert "".join(pattern[50:]) == "p" * 150  # with weight 0.2 throughout: one plain step in every six


def test_the_verification_time_beyond_t1_is_not_clipped():
    """Forwards jitter both ways around T(1): a forward faster than T(1) counts as a saving, so that jitter
    averages out instead of charging every draft its upper half."""
    policy = DraftPolicy(NgramDrafter())
    st = policy.begin_request(FLAT, 4, 1000)
    for forward_s in (0.013, 0.007):  # T(1) = 10 ms: +3 ms, then -3 ms
        policy.observe_proposal(st, DraftProposal([7], confidence=[0.9]), 0.0, 1, 0.0)
        st.drafted_s = 1e-9
        policy.observe_step(st, 1, 0, 2, forward_s)
    assert policy.saving == pytest.approx(0.0, abs=1e-6)



def _silenced_after(savings_ms, t1_ms: float = 33.0) -> list[bool]:
    """Whether a fresh policy is silenced after each of these drafted steps' savings (ms), at T(1) ``t1_ms``."""
    p = DraftPolicy(NetworkDrafter())
    out = []
    for s in savings_ms:
        p.observe_saving(s / 1e3, 1, t1_ms / 1e3)
        out.append(p.silenced)
    return out


def test_silencing_waits_for_a_sure_loss():
    """Across requests a drafter is silenced once its loss is sure (the mean saving's upper confidence bound is not
    positive), not when a few unlucky steps pull the mean below 0. The savings follow the Qwen head's measured
    steps (docs/bench/head-warmup-zen4/gate-question-steps.txt: about -3 to -6 ms for a rejected or unverified
    draft, +20 to +30 ms for an accepted token, one cold first call of -212 ms)."""
    unlucky = [-6.0] * 3 + [28.0] + [-6.0] * 4  # one accepted in 8: mean -1.75 ms, but that says little
    assert not any(_silenced_after(unlucky))
    cold_start = [-212.0, 19.7, -3.0, -4.0, 25.0, -3.0, -5.0, 22.0, -4.0, -3.0]  # one cold call, then a paying head
    assert not any(_silenced_after(cold_start))
    # a draft model that costs more than it saves at every step: silent after 4 steps
    assert _silenced_after([-15.0] * 6) == [False] * 3 + [True] * 3
    # a head that is never accepted: sure after 14 steps, silent from then on
    useless = _silenced_after([-3.0] * 30)
    assert useless == [False] * 13 + [True] * 17, useless
    # a head accepted at 1 step in 10 (+28 ms) that loses 4 ms otherwise: -0.8 ms a step, sure after 319 steps, as
    # a bound on an average of the last steps alone never would (its standard error stops shrinking)
    slight = _silenced_after(([-4.0] * 9 + [28.0]) * 200)
    assert slight.index(True) == 318 and slight[-1]
    # the earlier rule (silenced once the mean is not positive) silenced the unlucky head and the cold start at once
    p = DraftPolicy(NetworkDrafter())
    for s in cold_start[:2]:
        p.observe_saving(s / 1e3, 1, 0.033)
    assert p.saving < 0 and not p.silenced and p.saving_bound() > 0


def test_the_bound_is_infinite_before_two_steps_and_needs_the_steps_since_the_last_measure():
    """One step says nothing of the spread; a re-measure starts the evidence afresh."""
    p = DraftPolicy(NetworkDrafter())
    assert p.saving_bound() == math.inf and not p.silenced
    p.observe_saving(-1.0, 1, 0.0)  # a huge loss, no prior: still one step
    assert p.saving_bound() == math.inf and not p.silenced
    p.observe_saving(-1.0, 1, 0.0)
    assert p.silenced and p.measure_net == -2.0
    p.silent_s = 1e6  # the budget is spent: the next request re-measures, with no evidence
    st = p.begin_request(FLAT, 4, 64)
    assert st.remeasures and not st.silent and p.saving_bound() == math.inf and p.measure_sq == 0.0


def test_an_uncertain_loss_keeps_measuring_across_requests():
    """A drafter whose mean saving is negative but not surely so is not silenced: the next request drafts (not
    silent), and the evidence carries over (not forgotten, as a re-measure would), until the loss is sure."""
    p = DraftPolicy(NetworkDrafter())
    st = p.begin_request(FLAT, 4, 64)
    for s in [-6.0, -6.0, -6.0, 28.0, -6.0, -6.0]:
        p.observe_saving(s / 1e3, 1, 0.010)
    p.end_request(st, 5.0, drafted=True)
    assert p.saving < 0 and p.measure_net < 0 and not p.silenced
    st = p.begin_request(FLAT, 4, 64)
    assert not st.silent and not st.remeasures and p.saving_steps == 6
    for _ in range(40):
        p.observe_saving(-0.006, 1, 0.010)
    p.end_request(st, 5.0, drafted=True)
    assert p.silenced and p.begin_request(FLAT, 4, 64).silent


def test_a_drafter_that_stops_drafting_is_measured_afresh_in_either_state():
    """No state keeps a drafter waiting for good: one whose recent steps lost but whose loss is not sure, and
    that then drafts no more (a draft model whose catch-up no longer pays), and one surely silenced whose last
    steps paid, are both measured afresh once 1% of the time they sat out covers what they lost."""
    p = DraftPolicy(NetworkDrafter())
    for s in [-6.0, -6.0, -6.0, 28.0, -6.0, -6.0]:  # not sure, running average negative
        p.observe_saving(s / 1e3, 1, 0.010)
    assert p.losing and not p.silenced
    st = p.begin_request(FLAT, 4, 64)
    assert not st.silent and not st.remeasures
    p.end_request(st, 0.1, drafted=False)  # 0.1 s x 1% does not cover the 2 ms lost
    assert not p.begin_request(FLAT, 4, 64).remeasures
    p.end_request(st, 0.15, drafted=False)  # 0.25 s x 1% does
    assert p.begin_request(FLAT, 4, 64).remeasures and p.saving is None

    p = DraftPolicy(NetworkDrafter())
    for _ in range(200):
        p.observe_saving(-0.010, 1, 0.010)
    for _ in range(30):  # the last steps paid: the running average is positive, the loss since the measure sure
        p.observe_saving(0.005, 1, 0.010)
    assert p.saving > 0 and p.silenced and p.losing and p.measure_net < 0
    st = p.begin_request(FLAT, 4, 64)
    assert st.silent
    p.end_request(st, -p.measure_net / REMEASURE_BUDGET * 1.001, drafted=False)
    st = p.begin_request(FLAT, 4, 64)
    assert st.remeasures and not st.silent


def test_the_t_quantile_matches_the_tables():
    """Student's t at the 95% one-sided level (z = 1.645) against the tables, and the normal quantile in the limit;
    infinite below one degree of freedom."""
    exact = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 10: 1.812, 30: 1.697, 1000: 1.646}
    for dof, t in exact.items():
        assert _student_t(1.645, dof) == pytest.approx(t, rel=0.05 if dof == 1 else 0.003), dof
    assert _student_t(1.645, 0.5) == math.inf


def test_a_spread_needs_its_degrees_of_freedom():
    """Steps that differ: two of -20 and -10 ms are not a sure loss (1 degree of freedom), three are (2), at no
    prior; the variance is the sample's (n - 1), not the population's."""
    assert _silenced_after([-20.0, -10.0, -20.0], t1_ms=0.0) == [False, False, True]
    # mean -15 ms, sample sd 7.07 ms: 2 steps give -15 + 6.01 x 5.0 > 0; 3 steps give -16.7 + 2.91 x 3.33 < 0


def test_a_drafter_that_gained_before_is_measured_afresh_at_once_when_its_recent_steps_lose():
    """A drafter whose running average turned negative after it had gained overall since its last measure
    (``measure_net`` >= 0) is measured afresh at the next request, without sitting anything out: its old gains
    say nothing of a workload that changed, and the budget owes nothing."""
    p = DraftPolicy(NetworkDrafter())
    for _ in range(40):
        p.observe_saving(0.010, 2, 0.010)
    for _ in range(30):
        p.observe_saving(-0.003, 1, 0.010)
    assert p.saving < 0 and p.measure_net > 0 and not p.silenced and p.losing
    st = p.begin_request(FLAT, 4, 64)
    assert st.remeasures and not st.silent and p.saving is None and p.measure_net == 0.0
