"""Streaming text: an incremental detokenizer and a stop-string matcher.

`IncrementalDetokenizer` uses the prefix/read offset technique (Hugging Face TGI, vLLM): each new
token decodes only a short window — the tokens since the last emitted text plus a few before them
for context — and emits what the window's text gained. Text that ends in U+FFFD (a multi-byte
character split across byte tokens) is held back until the character completes. Seeding the window
with the prompt's last tokens makes leading spaces come out as they do in a full decode.

`StopStringMatcher` sits after it: it holds back a tail that could still grow into a stop string,
so a client never sees any part of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Prompt tokens that seed the decode window (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
PROMPT_WINDOW = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns sampled token ids into text deltas, one token at a time.

    The deltas returned by `add` always sum to `text`; wherever no character is pending, `text`
    equals `tokenizer.decode(output ids)` (with the same `skip_special_tokens`).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._token_ids: list[int] = list(prompt_token_ids[-PROMPT_WINDOW:])
        self._prefix_offset = 0  # start of the context window
        self._read_offset = len(self._token_ids)  # tokens before this have been emitted
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def add(self, token_id: int) -> str:
        """Append one output token; returns the newly completed text ("" while text is pending)."""
        self._token_ids.append(token_id)
        prefix_text = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._token_ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self._parts.append(delta)
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)
        if not isinstance(text, str):
            raise TypeError(f"tokenizer.decode returned {type(text).__name__}, expected str")
        return text


class StopStringMatcher:
    """Finds stop strings in streamed text without ever emitting any part of one.

    `feed` returns `(text safe to emit, stopped)`. Once it reports `stopped`, the text before the
    stop string has been emitted and `feed` must not be called again; at a finish for another reason
    (length, eos), `flush` releases the held-back tail.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)
        self._max_held = max((len(s) for s in self.stop), default=1) - 1
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """True once a stop string has been seen."""
        return self._stopped

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add a text delta; returns the text that can be emitted now and whether generation stops."""
        if self._stopped:
            raise RuntimeError("StopStringMatcher.feed called after a stop string matched")
        if not self.stop:
            return delta, False
        text = self._held + delta
        found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if found:
            self._stopped = True
            self._held = ""
            return text[: min(found)], True
        held = self._partial_stop_length(text)
        self._held = text[len(text) - held :]
        return text[: len(text) - held], False

    def flush(self) -> str:
        """Release the held-back tail (at a finish that is not a stop string)."""
        text, self._held = self._held, ""
        return text

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest tail of `text` that some stop string starts with."""
        for length in range(min(len(text), self._max_held), 0, -1):
            tail = text[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0
