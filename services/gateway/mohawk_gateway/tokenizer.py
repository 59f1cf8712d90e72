"""The model's tokenizer as the gateway uses it: prompts to ids, single ids back to text for logprobs.

The tokenizer comes from the model's own files (`open_model(path).load_tokenizer()`); loading the
bundled one takes seconds, so the app loads it in a thread while /health already answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import open_model


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the gateway calls."""

    chat_template: Any

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> Any: ...

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def __len__(self) -> int: ...


def load_tokenizer(model: str | None) -> Tokenizer:
    """The tokenizer of the model at `model` (None = the bundled one); slow, run it in a thread."""
    return cast(Tokenizer, open_model(model).load_tokenizer())


class PromptCodec:
    """Encodes prompts and names single tokens, caching the names (a vocabulary's worth at most)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self._token_texts: dict[int, str] = {}

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return [int(t) for t in encode_chat(self.tokenizer, messages)]

    def encode_text(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer(text, add_special_tokens=True)["input_ids"]]

    def token_text(self, token_id: int) -> str:
        """The text of one token on its own (special tokens included), as logprobs show it."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = str(self.tokenizer.decode([token_id], skip_special_tokens=False))
            self._token_texts[token_id] = text
        return text
