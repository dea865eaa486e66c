import pytest

from speculative.stats import GenerationStats

pytestmark = pytest.mark.quick


def test_counters_and_derived_rates():
    s = GenerationStats(num_speculative_tokens=3)
    s.steps = 1  # prefill emitted the first token
    s.record_step(3, 3)
    s.record_step(3, 0)
    s.record_step(2, 1)
    s.record_step(0, 0)  # a plain step (no draft)
    s.new_tokens = 1 + 4 + 1 + 2 + 1
    assert s.steps == 5
    assert s.draft_tokens == 8 and s.accepted_tokens == 4
    assert s.acceptance_rate == 0.5
    assert s.accept_counts == [1, 1, 0, 1]
    assert s.position_proposed == [3, 3, 2] and s.position_accepted == [2, 1, 1]
    assert s.per_position_acceptance == [2 / 3, 1 / 3, 0.5]
    assert s.mean_accepted_tokens == 9 / 5
    s.wall_time_s, s.prefill_time_s = 2.0, 0.5
    assert s.tokens_per_second == 4.5 and s.decode_tokens_per_second == 6.0
    d = s.to_dict()
    for key in ("steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_tokens", "accept_counts",
                "new_tokens", "prefill_time_s", "draft_time_s", "verify_time_s", "wall_time_s", "tokens_per_second",
                "decode_tokens_per_second"):
        assert key in d


def test_plain_decoding_is_one_token_per_step():
    s = GenerationStats(num_speculative_tokens=4)
    s.steps = 1
    for _ in range(9):
        s.record_step(0, 0)
    s.new_tokens = 10
    assert s.mean_accepted_tokens == 1.0 and s.acceptance_rate == 0.0
