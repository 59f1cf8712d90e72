"""A base model, whose tokenizer has no chat template: `/v1/completions` serves it, and
`/v1/chat/completions` answers 400 saying the model has no chat template, never a 500 (gateway under
uvicorn, real nats-server, scripted pipeline)."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.scripted import FakeTokenizer, ScriptedPipeline
from tests.gateway.test_errors import assert_openai_error


class BaseModelTokenizer(FakeTokenizer):
    chat_template = None  # type: ignore[assignment]  # what transformers gives for a GGUF without tokenizer.chat_template

    def apply_chat_template(self, conversation: object, *args: object, **kwargs: object) -> str:
        raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")


@pytest.fixture
def tokenizer() -> FakeTokenizer:
    return BaseModelTokenizer()


def test_chat_is_a_400_naming_the_missing_template(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    error = assert_openai_error(response, 400)
    assert "chat template" in error["message"] and error["type"] == "invalid_request_error", error
    assert not pipeline.requests  # refused before anything was sent


def test_text_completions_serve_it(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    data = client.post("/v1/completions", json={"prompt": "once upon", "max_tokens": 5}).json()
    assert data["choices"][0]["text"] == "Hello world!", data
