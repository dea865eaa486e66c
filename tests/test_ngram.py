import numpy as np
import pytest

from speculative.config import SamplingParams
from speculative.drafters import NgramDrafter, parse_drafter_spec
from speculative.errors import ConfigError
from speculative.sampling import Sampler


pytestmark = pytest.mark.quick

S = Sampler(SamplingParams())
RNG = np.random.default_rng(0)


def propose(d, st, ctx, k=4):
    return d.propose(st, ctx, k, S, RNG).tokens


def test_proposes_continuation_of_most_recent_longest_match():
    d = NgramDrafter(min_n=1, max_n=3)
    ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 0, 2, 3]
    st = d.start(ctx)
    # suffix [2, 3] last occurred at positions 7-8 (followed by 7, 8, 0, ...)
    assert propose(d, st, ctx) == [7, 8, 0, 2]
    assert propose(d, st, ctx, k=2) == [7, 8]


def test_longer_ngram_wins_over_more_recent_shorter_one():
    d = NgramDrafter(min_n=1, max_n=3)
    ctx = [5, 6, 7, 1, 7, 2, 5, 6, 7]
    st = d.start(ctx)
    # [5,6,7] occurs at 0-2 followed by 1; the unigram [7] occurs more recently (at 4, followed by 2)
    assert propose(d, st, ctx) == [1, 7, 2, 5]


def test_no_match_proposes_nothing_and_min_is_respected():
    d = NgramDrafter(min_n=2, max_n=3)
    ctx = [1, 2, 3, 4, 5, 6, 7, 3]
    st = d.start(ctx)
    assert propose(d, st, ctx) == []  # only the unigram [3] matches, below min=2


def test_incremental_index_equals_rebuilt_index():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 6, size=400).tolist()
    d = NgramDrafter(min_n=1, max_n=4)
    st = d.start(seq[:10])
    for n in range(11, 400, 7):
        inc = propose(d, st, seq[:n])
        fresh = propose(d, d.start(seq[:n]), seq[:n])
        assert inc == fresh


def test_rewritten_context_rebuilds():
    d = NgramDrafter(min_n=1, max_n=2)
    st = d.start([1, 2, 3, 1])
    assert propose(d, st, [1, 2, 3, 1]) == [2, 3, 1]
    assert propose(d, st, [4, 5, 6, 4]) == [5, 6, 4]  # not an extension: index rebuilt


def test_bad_options():
    with pytest.raises(ConfigError):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(ConfigError, match="unknown option 'n'"):
        parse_drafter_spec("ngram,n=3")
    with pytest.raises(ConfigError, match="unknown drafter type"):
        parse_drafter_spec("magic")
    with pytest.raises(ConfigError, match="needs a model"):
        parse_drafter_spec("model")
    with pytest.raises(ConfigError, match="key=value"):
        parse_drafter_spec("ngram,min")
    spec = parse_drafter_spec("model:foo.gguf,ctx=128")
    assert spec.kind == "model" and spec.name == "foo.gguf" and spec.options == {"ctx": "128"}
