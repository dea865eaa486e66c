"""The cost model and the analysis formulas, against hand-computed values."""


import pytest

from speculative.cost_model import (
    AcceptanceCalibration,
    CostModel,
    alpha_from_tau,
    choose_draft_length,
    drafting_gain_per_token,
    expected_tokens,
    predicted_speedup,
)
from speculative.drafters.base import ShadowScorer


def test_expected_tokens_and_its_inverse():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    for alpha in (0.1, 0.5, 0.8, 0.95):
        for k in (1, 3, 8):
            assert alpha_from_tau(expected_tokens(alpha, k), k) == pytest.approx(alpha, abs=1e-9)
    assert alpha_from_tau(1.0, 4) == 0.0 and alpha_from_tau(5.0, 4) == 1.0


def test_predicted_speedup_by_hand():
    # tau = 3 tokens/step, k = 4, drafter 1 ms/token, T(1) = 10 ms, T(5) = 30 ms:
    # S = 3 * 10 / (4 * 1 + 30) = 30 / 34
    assert predicted_speedup(3.0, 4, 0.001, 0.010, 0.030) == pytest.approx(30 / 34)
    # a free drafter at perfect acceptance reaches the ceiling (k+1) T(1) / T(k+1)
    cm = CostModel([1, 2, 4, 8], [0.010, 0.018, 0.028, 0.051])
    assert predicted_speedup(5.0, 4, 0.0, cm.time(1), cm.time(5)) == pytest.approx(cm.ceiling(4))


def test_drafting_gain_per_token_by_hand():
    flat = CostModel([1, 16], [0.010, 0.010])
    # alpha 0.5, free drafter, flat T: m = 8 gives 1.992 tokens per 10 ms, a saving of 10 - 10/1.992 ms
    assert drafting_gain_per_token(0.5, 0.0, flat, 8) == pytest.approx(0.010 - 0.010 / expected_tokens(0.5, 8))
    # a drafter that costs a whole step per token never saves anything at alpha 0.5
    assert drafting_gain_per_token(0.5, 0.010, flat, 8) == 0.0
    # m = 1: T(2) = 12 ms, drafter 2 ms, alpha 0.8: (2 + 12) / 1.8 ms per token
    cm = CostModel([1, 2, 4, 8], [0.010, 0.012, 0.028, 0.051])
    assert drafting_gain_per_token(0.8, 0.002, cm, 1) == pytest.approx(0.010 - 0.014 / 1.8)
    # with T(2) = 18 ms the same draft costs (2 + 18) / 1.8 = 11.1 ms a token: no saving
    steep = CostModel([1, 2, 4, 8], [0.010, 0.018, 0.028, 0.051])
    assert drafting_gain_per_token(0.8, 0.002, steep, 1) == 0.0
    assert drafting_gain_per_token(0.0, 0.0, cm, 4) == 0.0  # nothing accepted: nothing saved


def test_cost_model_interpolates_extrapolates_and_learns():
    cm = CostModel([1, 2, 4], [0.010, 0.018, 0.028])
    assert cm.time(3) == pytest.approx(0.023)
    assert cm.time(6) == pytest.approx(0.028 + 2 * 0.005)
    cm.update(2, 0.028)
    assert cm.time(2) == pytest.approx(0.018 + 0.1 * 0.010)
    cm.update(3, 0.020)
    assert cm.sizes == [1, 2, 3, 4] and cm.time(3) == 0.020
    assert CostModel.from_dict(cm.to_dict()).time(3) == 0.020


def test_choose_draft_length_weighs_confidence_against_cost():
    cm = CostModel([1, 2, 3, 4, 5], [0.010, 0.018, 0.024, 0.030, 0.036])
    rate = 1 / 0.010  # plain decoding's rate
    # the first extra token costs 8 ms, worth 0.8 tokens at this rate: needs confidence > 0.8
    assert choose_draft_length([0.7], cm, rate) == 0
    assert choose_draft_length([0.9], cm, rate) == 1
    # later tokens are cheaper (6 ms): a confident chain is taken as far as it pays
    assert choose_draft_length([0.95, 0.95, 0.95, 0.2], cm, rate) == 3
    assert choose_draft_length([], cm, rate) == 0
    # when verification is nearly free (a GPU), even a modest chance pays
    flat = CostModel([1, 16], [0.010, 0.0105])
    assert choose_draft_length([0.3, 0.3, 0.3], flat, rate) == 3


def test_calibration_is_pessimistic_then_converges():
    cal = AcceptanceCalibration(prior={("a",): (2.0, 2.0)}, caution=0.5)
    fresh = cal.estimate(("a",))
    assert fresh < 0.5  # mean 0.5 minus half a standard deviation
    for _ in range(400):
        cal.observe(("a",), True)
    for _ in range(100):
        cal.observe(("a",), False)
    assert cal.estimate(("a",)) == pytest.approx(0.8, abs=0.03)
    assert AcceptanceCalibration(caution=0).estimate(("x",)) == 0.5


def test_shadow_scorer_counts_until_first_mismatch():
    sc = ShadowScorer(AcceptanceCalibration(caution=0))
    sc.record(3, [7, 8, 9], [("p", 0), ("p", 1), ("p", 2)])
    sc.score([0, 1, 2, 7])  # only the first token is known yet
    assert sc.calibration.counts == {("p", 0): [1.0, 1.0]} and len(sc.pending) == 1
    sc.score([0, 1, 2, 7, 8, 5])  # second right, third wrong: resolved
    assert sc.calibration.counts[("p", 1)] == [1.0, 1.0] and sc.calibration.counts[("p", 2)] == [0.0, 1.0]
    assert sc.pending == []


def test_choose_tree_nodes_by_path_probability():
    from speculative.cost_model import choose_tree_nodes

    cm = CostModel([1, 2, 3, 4, 5, 6], [0.010, 0.016, 0.021, 0.026, 0.031, 0.036])
    rate = 1 / 0.010
    parents = [-1, -1, 0, 0, 2]
    conf = [0.9, 0.3, 0.9, 0.05, 0.9]  # values: 0.9, 0.3, 0.81, 0.045, 0.729
    chosen = choose_tree_nodes(parents, conf, cm, rate)
    assert chosen == [0, 2, 4]  # the confident chain; the weak siblings do not pay for their cost
    flat = CostModel([1, 16], [0.010, 0.0101])
    assert choose_tree_nodes(parents, conf, flat, rate) == [0, 1, 2, 3, 4]
    # a child is never chosen without its parent
    assert choose_tree_nodes([-1, 0], [0.01, 1.0], flat, rate, allowed=[1]) == []


def test_sampled_drafts_are_verified_whole():
    """The adaptive policy may cut a deterministic draft, never a sampled one: choosing the
    verified length from the random draft's own confidences would bias the output."""
    from types import SimpleNamespace

    import numpy as np

    from speculative.drafters.base import DraftProposal
    from speculative.engine import DecodeRequest

    steep = CostModel(sizes=[1, 2, 4, 8], seconds=[0.01, 0.02, 0.04, 0.08])
    me = SimpleNamespace(cost=steep, rate=lambda: 100.0)
    conf = [0.9, 0.05, 0.05, 0.05]
    det = DraftProposal(tokens=[1, 2, 3, 4], confidence=conf)
    sampled = DraftProposal(tokens=[1, 2, 3, 4], confidence=conf, probs=np.full((4, 8), 1 / 8))
    assert DecodeRequest.choose_length(me, det) < 4
    assert DecodeRequest.choose_length(me, sampled) == 4
