"""How many tokens a request may use: the plan's context first, then its tenant's tokens a minute.

Design. `check_context` refuses with 400 `context_length_exceeded` a prompt that fills the
plan's context, or a prompt plus `max_tokens` that overflows it, before anything reaches the bus.
`lease_tokens` then takes the tenant's rate lease (access.py), charging up front what the request
may use: its prompt plus `max_tokens`; a request without `max_tokens` is charged its prompt plus a
floor (`token_estimate`, less when its cap is less), and is then given a `max_tokens` of its own:
its cap (`completion_cap`: what the context leaves, and the tenant's tpm), and for a tenant with a
tpm no more than the tenant's window grants now, so what it generates stays within the tenant's
tokens a minute. The anonymous tenant has no lease, only the context's cap.
"""

from __future__ import annotations

from mohawk_common.tenancy import RateDecision, completion_cap
from mohawk_gateway.access import Access
from mohawk_gateway.errors import invalid
from mohawk_gateway.submission import Submission


def check_context(submission: Submission, max_model_len: int | None) -> None:
    """400 unless the prompt, and the prompt plus `max_tokens`, fit the context (None: unknown)."""
    if max_model_len is None:
        return
    num_prompt = submission.num_prompt_tokens
    if num_prompt >= max_model_len:
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{num_prompt} tokens. Please shorten your prompt.",
            param=submission.prompt_param,
            code="context_length_exceeded",
        )
    sampling = submission.sampling
    if sampling.HasField("max_tokens") and num_prompt + sampling.max_tokens > max_model_len:
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt + sampling.max_tokens} tokens ({num_prompt} in the prompt, "
            f"{sampling.max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )


async def lease_tokens(
    access: Access, submission: Submission, max_model_len: int | None, token_estimate: int
) -> RateDecision | None:
    """The tenant's rate lease for the request (429 without one; None for the anonymous tenant),
    and a `max_tokens` set on a request that has none."""
    cap = _completion_cap(submission, max_model_len)
    lease = await access.admit(submission.tenant, _charge(submission, cap, token_estimate))
    return await _grant_completion(access, submission, cap, lease)


def _charge(submission: Submission, cap: int | None, token_estimate: int) -> int:
    """Tokens charged to the tenant up front: prompt + max_tokens; for a request without
    max_tokens, prompt + a floor (`token_estimate`, less when its cap is less), which
    `_grant_completion` then grows to what the tenant's window has left."""
    sampling = submission.sampling
    if sampling.HasField("max_tokens"):
        return submission.charged_tokens
    num_prompt = submission.num_prompt_tokens
    if cap is None:
        return num_prompt + token_estimate
    return num_prompt + max(sampling.min_tokens, min(cap, token_estimate))


async def _grant_completion(
    access: Access, submission: Submission, cap: int | None, lease: RateDecision | None
) -> RateDecision | None:
    """Give a request without max_tokens one: its cap, and for a tenant with a tpm no more than
    its window grants now."""
    sampling, tenant = submission.sampling, submission.tenant
    if sampling.HasField("max_tokens") or cap is None:
        return lease
    num_prompt = submission.num_prompt_tokens
    granted = max(cap, sampling.min_tokens)  # min_tokens must not exceed it
    limiter = access.limiter
    if lease is not None and limiter is not None and tenant is not None and tenant.tpm is not None:
        lease = await limiter.extend(tenant, lease, num_prompt + granted)
        granted = max(lease.lease.charged_tokens - num_prompt, sampling.min_tokens)
    sampling.max_tokens = granted
    return lease


def _completion_cap(submission: Submission, max_model_len: int | None) -> int | None:
    tenant = submission.tenant
    tpm = tenant.tpm if tenant is not None else None
    return completion_cap(submission.num_prompt_tokens, max_model_len, tpm)
