"""SamplingParams: defaults, normalisation, and one readable error line per bad value."""

from __future__ import annotations

import pydantic
import pytest

from mohawk_common.errors import InvalidRequestError
from mohawk_shard.engine.sampling_params import SamplingParams


def test_defaults_are_plain_random_sampling() -> None:
    params = SamplingParams()
    assert params.temperature == 1.0
    assert params.top_p == 1.0
    assert params.top_k == 0
    assert params.stop == ()
    assert params.logprobs is None
    assert not params.is_greedy


@pytest.mark.parametrize(
    ("kwargs", "greedy"),
    [
        ({"temperature": 0.0}, True),
        ({"temperature": 0.7, "top_k": 1}, True),
        ({"temperature": 0.7, "top_k": 2}, False),
        ({"temperature": 1e-6}, True),
    ],
)
def test_is_greedy(kwargs: dict[str, float], greedy: bool) -> None:
    assert SamplingParams.create(**kwargs).is_greedy is greedy


def test_normalisation() -> None:
    params = SamplingParams.create(top_k=-1, stop="###", stop_token_ids=[7, 8])
    assert params.top_k == 0
    assert params.stop == ("###",)
    assert params.stop_token_ids == (7, 8)
    assert SamplingParams.create(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams.create(stop=None).stop == ()


def test_frozen_and_hashable() -> None:
    params = SamplingParams.create(temperature=0.5, stop=["x"])
    with pytest.raises(pydantic.ValidationError):
        setattr(params, "temperature", 1.0)  # noqa: B010 - bypasses the type checker on purpose
    assert hash(params) == hash(SamplingParams.create(temperature=0.5, stop=["x"]))


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"temperature": 3.0}, "temperature", "must be between 0 and 2 (got 3.0)"),
        ({"temperature": -0.1}, "temperature", "must be between 0 and 2"),
        ({"temperature": float("nan")}, "temperature", "(got nan)"),
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"top_p": 0.0}, "top_p", "must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p", "must be in (0, 1]"),
        ({"top_k": -2}, "top_k", "at least 1"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"min_tokens": -1}, "min_tokens", "at least 0"),
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens", "must not exceed max_tokens"),
        ({"stop": ["ok", ""]}, "stop", "empty"),
        ({"stop": [str(i) for i in range(17)]}, "stop", "at most 16"),
        ({"stop": [1]}, "stop[0]", "valid string"),
        ({"stop_token_ids": [-3]}, "stop_token_ids", "negative"),
        ({"presence_penalty": 2.5}, "presence_penalty", "between -2 and 2"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "between -2 and 2"),
        ({"logprobs": 21}, "logprobs", "between 0 and 20"),
        ({"logprobs": -1}, "logprobs", "between 0 and 20"),
        ({"best_of": 2}, "best_of", "unknown parameter"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.create(**kwargs)
    message = str(info.value)
    assert message.startswith(f"invalid sampling parameter {field}: ")
    assert fragment in message
    assert "\n" not in message


def test_exact_message() -> None:
    with pytest.raises(InvalidRequestError, match=r"^invalid sampling parameter temperature: "):
        SamplingParams.create(temperature=3.0)
    try:
        SamplingParams.create(temperature=3.0)
    except InvalidRequestError as exc:
        assert str(exc) == "invalid sampling parameter temperature: must be between 0 and 2 (got 3.0)"


def test_boundaries_are_accepted() -> None:
    params = SamplingParams.create(
        temperature=2.0,
        top_p=1.0,
        top_k=1,
        max_tokens=1,
        min_tokens=1,
        stop=[str(i) for i in range(16)],
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        logprobs=20,
        seed=-5,
    )
    assert params.min_tokens == params.max_tokens == 1
    assert len(params.stop) == 16


def test_constructor_raises_pydantic_error() -> None:
    with pytest.raises(pydantic.ValidationError):
        SamplingParams(temperature=5.0)
