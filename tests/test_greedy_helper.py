"""The suite's greedy-identity check (conftest.assert_greedy_identical) on a stand-in backend: a divergence
is accepted only at a near-tie, and the output after the tie is still checked, to the end."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SequenceStub, assert_greedy_identical
from speculative.backends.base import ForwardResult


pytestmark = pytest.mark.quick

V = 16
TIE_AFTER = (0, 1, 2)  # after this context, tokens 3 and 9 tie (top-2 gap 1e-4)


class CountingBackend(SequenceStub):
    """Next token = last token + 1, by a wide margin, except right after TIE_AFTER."""

    def forward(self, reqs):
        ctx = list(reqs[0].tokens)
        row = np.zeros(V, dtype=np.float32)
        row[(ctx[-1] + 1) % V] = 10.0
        if tuple(ctx) == TIE_AFTER:
            row[9] = 10.0 - 1e-4
        return [ForwardResult(row[None])]


PROMPT, PLAIN = [0], [1, 2, 3, 4, 5, 6]


def test_identical_outputs_pass():
    assert_greedy_identical(CountingBackend(), PROMPT, PLAIN, list(PLAIN), exact=True)


def test_a_divergence_at_a_tie_is_accepted_and_the_rest_checked():
    ties = []
    resumed = []

    def resume(prefix, n):  # a correct engine continues the reference after the tie
        resumed.append((prefix, n))
        return PLAIN[len(prefix):][:n]

    assert_greedy_identical(CountingBackend(), PROMPT, PLAIN, [1, 2, 9, 10, 11, 12], exact=False, ties=ties,
                            resume=resume)
    assert [i for _, i, _ in ties] == [2] and resumed == [([1, 2, 3], 3)]


def test_a_wrong_token_after_a_tie_is_caught():
    """The engine's output diverges at the tie, then, continued from the reference's token, emits a wrong
    token later (a bug that only a check past the tie sees)."""
    with pytest.raises(AssertionError, match="diverge at new token 4.*not a tie"):
        assert_greedy_identical(CountingBackend(), PROMPT, PLAIN, [1, 2, 9, 10, 11, 12], exact=False,
                                resume=lambda prefix, n: [4, 7, 6][:n])


def test_a_tie_without_resume_is_not_a_pass():
    with pytest.raises(AssertionError, match="no resume="):
        assert_greedy_identical(CountingBackend(), PROMPT, PLAIN, [1, 2, 9, 10, 11, 12], exact=False)


@pytest.mark.parametrize("spec", [[1, 2, 3, 4, 0, 6], [1, 2, 3], [1, 2, 9, 10, 11, 12]])
def test_exact_comparison_fails_on_any_difference(spec):
    with pytest.raises(AssertionError, match="diverge"):
        assert_greedy_identical(CountingBackend(), PROMPT, PLAIN, spec, exact=True)
