"""token_budget.py without a bus or Redis: the context check, and the max_tokens a request without
one is given (the tenant's window, which needs Redis, is tested in test_tenants.py)."""

from __future__ import annotations

import asyncio

import pytest

from mohawk_common.tenancy import Tenant
from mohawk_gateway.access import Access
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.errors import GatewayError
from mohawk_gateway.submission import Submission
from mohawk_gateway.token_budget import check_context, lease_tokens
from mohawk_proto.v1 import engine_pb2


def _submission(num_prompt: int, max_tokens: int | None = None, tenant: Tenant | None = None) -> Submission:
    sampling = engine_pb2.SamplingParams()
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    return Submission("cmpl-1", "completions", [1] * num_prompt, sampling, "prompt", tenant=tenant)


def test_a_prompt_that_fills_the_context_is_refused_naming_the_prompt() -> None:
    with pytest.raises(GatewayError) as caught:
        check_context(_submission(16), max_model_len=16)
    assert caught.value.status == 400
    assert caught.value.body()["error"]["param"] == "prompt"
    assert caught.value.body()["error"]["code"] == "context_length_exceeded"


def test_a_prompt_and_max_tokens_over_the_context_is_refused_naming_max_tokens() -> None:
    check_context(_submission(10, max_tokens=6), max_model_len=16)  # fits exactly
    with pytest.raises(GatewayError) as caught:
        check_context(_submission(10, max_tokens=7), max_model_len=16)
    assert caught.value.body()["error"]["param"] == "max_tokens"


def test_an_unknown_context_checks_nothing() -> None:
    check_context(_submission(100_000, max_tokens=100_000), max_model_len=None)


@pytest.mark.parametrize(
    ("tenant", "max_model_len", "expected"),
    [
        (None, 64, 54),  # what the context leaves after the prompt
        (Tenant(name="acme", tpm=30), 64, 20),  # what the tenant's tokens a minute leave
        (Tenant(name="acme", tpm=5), 64, 1),  # at least 1: the prompt alone is over the tpm
        (None, None, None),  # nothing bounds it: no max_tokens is set
    ],
)
def test_a_request_without_max_tokens_is_given_its_cap(
    tenant: Tenant | None, max_model_len: int | None, expected: int | None
) -> None:
    submission = _submission(10, tenant=tenant)
    access = Access(GatewaySettings.model_validate({"insecure": True}))
    lease = asyncio.run(lease_tokens(access, submission, max_model_len, token_estimate=16))
    assert lease is None  # no Redis: no tenant lease
    sampling = submission.sampling
    assert (sampling.max_tokens if sampling.HasField("max_tokens") else None) == expected


def test_a_request_with_max_tokens_keeps_it() -> None:
    submission = _submission(10, max_tokens=3)
    access = Access(GatewaySettings.model_validate({"insecure": True}))
    asyncio.run(lease_tokens(access, submission, 64, token_estimate=16))
    assert submission.sampling.max_tokens == 3
