"""What both renderers need: ids, timestamps, usage from the last event."""

from __future__ import annotations

import time
import uuid

from mohawk_gateway.schemas.common import PromptTokensDetails, UsagePublic
from mohawk_proto.v1 import engine_pb2


def new_request_id(prefix: str) -> str:
    """`<prefix>-<32 hex>`: the response id, and the request id on the bus ([A-Za-z0-9_-] only)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage_of(last: engine_pb2.TokenEvent, num_prompt_tokens: int, num_tokens: int) -> UsagePublic:
    """The engine's usage from the last event, else what the gateway counted itself."""
    if last.HasField("usage") and last.usage.total_tokens > 0:
        usage = last.usage
        return UsagePublic(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        )
    return UsagePublic(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_tokens,
        total_tokens=num_prompt_tokens + num_tokens,
    )
