"""Token events of one text completion as an OpenAI `text_completion` (legacy logprobs form)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from mohawk_gateway.generation import Generation
from mohawk_gateway.render.common import usage_of
from mohawk_gateway.schemas.common import UsagePublic
from mohawk_gateway.schemas.completions import (
    CompletionChoicePublic,
    CompletionLogprobsPublic,
    CompletionPublic,
)
from mohawk_gateway.tokenizer import PromptCodec
from mohawk_proto.v1 import engine_pb2


class CompletionRenderer:
    def __init__(
        self,
        codec: PromptCodec,
        *,
        request_id: str,
        model: str,
        created: int,
        num_prompt_tokens: int,
        logprobs: int | None,
        include_usage: bool,
    ) -> None:
        self.codec = codec
        self.request_id = request_id
        self.model = model
        self.created = created
        self.num_prompt_tokens = num_prompt_tokens
        self.logprobs = logprobs
        self.include_usage = include_usage
        self._text_offset = 0

    def completion(self, events: Sequence[engine_pb2.TokenEvent], num_tokens: int) -> CompletionPublic:
        choice = CompletionChoicePublic(
            text="".join(event.text for event in events),
            logprobs=self._logprobs(events),
            finish_reason=events[-1].finish_reason,
        )
        usage = usage_of(events[-1], self.num_prompt_tokens, num_tokens)
        return self._body([choice], usage)

    async def chunks(self, first: engine_pb2.TokenEvent, generation: Generation) -> AsyncIterator[str]:
        event = first
        while True:
            logprobs = self._logprobs([event])
            has_logprob = logprobs is not None and bool(logprobs.tokens)
            if event.text or has_logprob or event.finish_reason:
                choice = CompletionChoicePublic(
                    text=event.text, logprobs=logprobs, finish_reason=event.finish_reason or None
                )
                yield self._body([choice], None).model_dump_json(exclude_none=True)
            if event.finish_reason:
                if self.include_usage:
                    usage = usage_of(event, self.num_prompt_tokens, generation.num_tokens)
                    yield self._body([], usage).model_dump_json(exclude_none=True)
                return
            event = await generation.next_event()

    def _body(self, choices: list[CompletionChoicePublic], usage: UsagePublic | None) -> CompletionPublic:
        return CompletionPublic(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _logprobs(self, events: Sequence[engine_pb2.TokenEvent]) -> CompletionLogprobsPublic | None:
        if self.logprobs is None:
            return None
        result = CompletionLogprobsPublic()
        for event in events:
            if event.HasField("logprob"):
                result.tokens.append(self.codec.token_text(event.token_id))
                result.token_logprobs.append(event.logprob)
                tops = {self.codec.token_text(top.token_id): top.logprob for top in event.top_logprobs}
                result.top_logprobs.append(tops)
                result.text_offset.append(self._text_offset)
            self._text_offset += len(event.text)
        return result
