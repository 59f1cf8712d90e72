"""The official `openai` client works against the gateway unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import ServerThread, wait_until
from tests.gateway.scripted import MODEL, ScriptedPipeline

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def sdk(gateway: ServerThread, client: object) -> Iterator[openai.OpenAI]:
    """An OpenAI client of a ready gateway (`client` waits for readiness)."""
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=10) as sdk:
        yield sdk


def test_chat(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(model=MODEL, messages=USER, temperature=0, seed=1)
    assert reply.id.startswith("chatcmpl-") and reply.model == MODEL
    assert reply.choices[0].message.content == "Hello world!" and reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_chat_stream_with_usage_and_logprobs(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=1,
        max_completion_tokens=10,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world!"
    tokens = [
        lp.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.content or []
    ]
    assert tokens == ["Hello", "world", "!"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_completions_and_models(sdk: openai.OpenAI, pipeline: ScriptedPipeline) -> None:
    reply = sdk.completions.create(model=MODEL, prompt="once upon a time", max_tokens=2)
    assert reply.choices[0].text == "Hello world" and reply.choices[0].finish_reason == "length"
    streamed = sdk.completions.create(model=MODEL, prompt=[4, 5], stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "Hello world!"
    assert [m.id for m in sdk.models.list()] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL


def test_errors_raise_the_matching_exceptions(sdk: openai.OpenAI, pipeline: ScriptedPipeline) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=MODEL, messages=USER, n=2)
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="gpt-4", messages=USER)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-4")
    with pytest.raises(openai.BadRequestError):  # the engine refuses this prompt
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "error"}], stream=True)
    with pytest.raises(openai.APIError, match="stage lost"):  # an error after the first token
        list(
            sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "lateerror"}], stream=True
            )
        )
    wait_until(lambda: len(pipeline.requests) == 2)  # only the two engine-error requests reached the bus
