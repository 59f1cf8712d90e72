"""POST /v1/completions (a string prompt, or token ids)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mohawk_gateway.api.deps import GatewayDep, TenantDep
from mohawk_gateway.api.respond import respond
from mohawk_gateway.errors import invalid
from mohawk_gateway.render.common import new_request_id, now
from mohawk_gateway.render.completions import CompletionRenderer
from mohawk_gateway.routing import prompt_affinity_key
from mohawk_gateway.sampling import build_sampling
from mohawk_gateway.schemas.completions import CompletionCreate
from mohawk_gateway.submission import Submission

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionCreate, request: Request, gateway: GatewayDep, tenant: TenantDep
) -> Response:
    codec = gateway.ready_codec(body.model)
    gateway.check_wait(tenant)  # before any work is spent on it
    if isinstance(body.prompt, str):
        prompt = await gateway.encode(codec.encode_text, body.prompt, "prompt")
    else:
        prompt = list(body.prompt)
        outside = [t for t in prompt if t >= codec.vocab_size]
        if outside:
            raise invalid(
                f"invalid value for 'prompt': token id {outside[0]} is outside the vocabulary "
                f"(size {codec.vocab_size})",
                "prompt",
            )
    sampling = build_sampling(body, max_tokens=body.max_tokens, logprobs=body.logprobs)
    request_id = new_request_id("cmpl")
    renderer = CompletionRenderer(
        codec,
        request_id=request_id,
        model=gateway.served_model,
        created=now(),
        num_prompt_tokens=len(prompt),
        logprobs=body.logprobs,
        include_usage=body.include_usage,
    )
    submission = Submission(
        request_id, "completions", prompt, sampling, "prompt", prompt_affinity_key(prompt), tenant=tenant
    )
    return await respond(request, gateway, submission, renderer, stream=bool(body.stream))
