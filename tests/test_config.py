import pytest

from speculative.config import GenerationConfig, SamplingParams
from speculative.errors import ConfigError


pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 2.5}, "num_speculative_tokens"),
    ],
)
def test_generation_config_rejects(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        GenerationConfig(**kwargs).validate()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -5}, "seed"),
        ({"repetition_penalty": 1.6e-175}, "repetition_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ],
)
def test_sampling_params_rejects(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SamplingParams(**kwargs).validate()


def test_with_overrides_sampling_fields():
    cfg = GenerationConfig().with_(temperature=0.7, top_k=5, max_new_tokens=9)
    assert cfg.sampling.temperature == 0.7 and cfg.sampling.top_k == 5 and cfg.max_new_tokens == 9
    assert not cfg.sampling.greedy and GenerationConfig().sampling.greedy


@pytest.mark.parametrize("kwargs, fragment", [({"stop": 5}, "stop must be a string or a list"),
                                              ({"bogus": 1}, "unknown generation option 'bogus'")])
def test_with_refuses_bad_options_in_one_line(kwargs, fragment):
    """What generate(**options) passes on: a wrong type or an unknown name is a ConfigError, not a TypeError."""
    with pytest.raises(ConfigError, match=fragment):
        GenerationConfig().with_(**kwargs)
