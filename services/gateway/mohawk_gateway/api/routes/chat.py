"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mohawk_gateway.api.deps import GatewayDep, TenantDep
from mohawk_gateway.api.respond import respond
from mohawk_gateway.render.chat import chat_renderer
from mohawk_gateway.render.common import new_request_id
from mohawk_gateway.routing import chat_affinity_key
from mohawk_gateway.sampling import build_sampling
from mohawk_gateway.schemas.chat import ChatCompletionCreate
from mohawk_gateway.submission import Submission

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionCreate, request: Request, gateway: GatewayDep, tenant: TenantDep
) -> Response:
    codec = gateway.ready_codec(body.model)
    gateway.check_wait(tenant)  # before any work is spent on it
    messages = [message.for_template() for message in body.messages]
    prompt = await gateway.encode_chat(codec, messages, "messages")
    sampling = build_sampling(body, max_tokens=body.token_limit, logprobs=body.num_logprobs)
    request_id = new_request_id("chatcmpl")
    renderer = chat_renderer(
        codec,
        request_id,
        gateway.served_model,
        prompt,
        logprobs=bool(body.logprobs),
        include_usage=body.include_usage,
    )
    key = chat_affinity_key(messages)
    submission = Submission(request_id, "chat", prompt, sampling, "messages", key, tenant=tenant)
    return await respond(request, gateway, submission, renderer, stream=bool(body.stream))
