"""Token events of one chat request as an OpenAI `chat.completion` or a stream of chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from mohawk_gateway.generation import Generation
from mohawk_gateway.render.common import now, usage_of
from mohawk_gateway.schemas.chat import (
    ChatChoicePublic,
    ChatChunkChoicePublic,
    ChatCompletionChunkPublic,
    ChatCompletionPublic,
    ChatDeltaPublic,
    ChatLogprobsPublic,
    ChatMessagePublic,
    TokenLogprobPublic,
    TopLogprobPublic,
)
from mohawk_gateway.schemas.common import UsagePublic
from mohawk_gateway.tokenizer import PromptCodec
from mohawk_proto.v1 import engine_pb2


class ChatRenderer:
    def __init__(
        self,
        codec: PromptCodec,
        *,
        request_id: str,
        model: str,
        created: int,
        num_prompt_tokens: int,
        logprobs: bool,
        include_usage: bool,
    ) -> None:
        self.codec = codec
        self.request_id = request_id
        self.model = model
        self.created = created
        self.num_prompt_tokens = num_prompt_tokens
        self.logprobs = logprobs
        self.include_usage = include_usage

    def completion(self, events: Sequence[engine_pb2.TokenEvent], num_tokens: int) -> ChatCompletionPublic:
        entries = [entry for event in events if (entry := self._logprob(event)) is not None]
        choice = ChatChoicePublic(
            message=ChatMessagePublic(content="".join(event.text for event in events)),
            logprobs=ChatLogprobsPublic(content=entries) if self.logprobs else None,
            finish_reason=events[-1].finish_reason,
        )
        return ChatCompletionPublic(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(events[-1], self.num_prompt_tokens, num_tokens),
        )

    async def chunks(self, first: engine_pb2.TokenEvent, generation: Generation) -> AsyncIterator[str]:
        """JSON chunks: the role, one per token event with text or logprobs, the finish, the usage."""
        yield self._chunk(ChatDeltaPublic(role="assistant", content=""))
        event = first
        while True:
            entry = self._logprob(event)
            if event.text or entry is not None:
                logprobs = ChatLogprobsPublic(content=[entry]) if entry is not None else None
                yield self._chunk(ChatDeltaPublic(content=event.text), logprobs=logprobs)
            if event.finish_reason:
                yield self._chunk(ChatDeltaPublic(), finish_reason=event.finish_reason)
                if self.include_usage:
                    yield self._usage_chunk(usage_of(event, self.num_prompt_tokens, generation.num_tokens))
                return
            event = await generation.next_event()

    def _chunk(
        self,
        delta: ChatDeltaPublic,
        *,
        logprobs: ChatLogprobsPublic | None = None,
        finish_reason: str | None = None,
    ) -> str:
        choice = ChatChunkChoicePublic(delta=delta, logprobs=logprobs, finish_reason=finish_reason)
        chunk = ChatCompletionChunkPublic(
            id=self.request_id, created=self.created, model=self.model, choices=[choice]
        )
        return chunk.model_dump_json(exclude_none=True)

    def _usage_chunk(self, usage: UsagePublic) -> str:
        chunk = ChatCompletionChunkPublic(
            id=self.request_id, created=self.created, model=self.model, choices=[], usage=usage
        )
        return chunk.model_dump_json(exclude_none=True)

    def _logprob(self, event: engine_pb2.TokenEvent) -> TokenLogprobPublic | None:
        if not self.logprobs or not event.HasField("logprob"):
            return None
        token = self.codec.token_text(event.token_id)
        return TokenLogprobPublic(
            token=token,
            logprob=event.logprob,
            bytes=list(token.encode()),
            top_logprobs=[self._top(top) for top in event.top_logprobs],
        )

    def _top(self, top: engine_pb2.TopLogprob) -> TopLogprobPublic:
        token = self.codec.token_text(top.token_id)
        return TopLogprobPublic(token=token, logprob=top.logprob, bytes=list(token.encode()))


def chat_renderer(
    codec: PromptCodec,
    request_id: str,
    model: str,
    prompt: Sequence[int],
    *,
    logprobs: bool,
    include_usage: bool,
) -> ChatRenderer:
    """The renderer of a chat completion answered now for `prompt`."""
    return ChatRenderer(
        codec,
        request_id=request_id,
        model=model,
        created=now(),
        num_prompt_tokens=len(prompt),
        logprobs=logprobs,
        include_usage=include_usage,
    )
