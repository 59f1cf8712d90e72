"""Chat messages to prompt token ids, through the model's own chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mohawk_common.errors import InvalidRequestError

ROLES = frozenset({"system", "user", "assistant"})


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's chat template, ready for the assistant's turn."""
    if not messages:
        raise InvalidRequestError("messages must hold at least one message")
    for message in messages:
        if message.get("role") not in ROLES:
            raise InvalidRequestError(
                f"message role must be one of {sorted(ROLES)}, got {message.get('role')!r}"
            )
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model's tokenizer has no chat template; send a plain prompt instead")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
