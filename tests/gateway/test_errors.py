"""Bad input gets OpenAI's error body with the right status (400, never 422), and no request reaches
the bus; an oversized body is refused with 413 without being read whole."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.scripted import ScriptedPipeline

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

BAD_CHAT: list[tuple[Any, str | None]] = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content",
    ),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "temperature": 2.5}, "temperature"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "top_k": -2}, "top_k"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": 1.5}, "max_tokens"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "stop": ["a"] * 17}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "stop": 3}, "stop"),
    ({"messages": USER, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": USER, "seed": 2**64}, "seed"),
    ({"messages": USER, "max_tokens": 3, "min_tokens": 5}, "min_tokens"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": USER, "logit_bias": {"5": 1.0}}, "logit_bias"),
    ([1, 2], None),
]

BAD_COMPLETIONS: list[tuple[Any, str | None]] = [
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": [1, 5000]}, "prompt"),  # outside the vocabulary
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
]


@pytest.fixture
def bus_quiet(pipeline: ScriptedPipeline) -> Iterator[None]:
    before = len(pipeline.requests)
    yield
    assert len(pipeline.requests) == before, "a refused request reached the bus"


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
        assert param in error["message"]
    return dict(error)


def test_invalid_bodies_are_400_naming_the_field(client: httpx.Client, bus_quiet: None) -> None:
    for body, param in BAD_CHAT:
        error = assert_openai_error(client.post(CHAT, json=body), 400, param)
        assert error["type"] == "invalid_request_error"
    for body, param in BAD_COMPLETIONS:
        assert_openai_error(client.post("/v1/completions", json=body), 400, param)


def test_malformed_json_and_non_json_bodies_are_400(client: httpx.Client, bus_quiet: None) -> None:
    headers = {"content-type": "application/json"}
    error = assert_openai_error(client.post(CHAT, content=b'{"messages": [', headers=headers), 400)
    assert "malformed JSON" in error["message"]
    assert_openai_error(client.post(CHAT, content=b"", headers=headers), 400)
    assert_openai_error(client.post(CHAT, content=b"hello", headers={"content-type": "text/plain"}), 400)


def test_unknown_model_is_404(client: httpx.Client, bus_quiet: None) -> None:
    error = assert_openai_error(client.post(CHAT, json={"model": "gpt-4", "messages": USER}), 404, "model")
    assert error["code"] == "model_not_found"
    assert_openai_error(client.post("/v1/completions", json={"model": "x", "prompt": "a"}), 404, "model")
    assert client.get("/v1/nothing").status_code == 404
    assert_openai_error(client.get(CHAT), 405)


def test_prompt_past_the_context_is_400(client: httpx.Client, bus_quiet: None) -> None:
    long = " ".join(f"w{i}" for i in range(70))  # max_model_len is 64
    error = assert_openai_error(
        client.post(CHAT, json={"messages": [{"role": "user", "content": long}]}), 400
    )
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    error = assert_openai_error(
        client.post(CHAT, json={"messages": USER, "max_tokens": 100}), 400, "max_tokens"
    )
    assert error["code"] == "context_length_exceeded"
    error = assert_openai_error(client.post("/v1/completions", json={"prompt": list(range(64))}), 400)
    assert error["code"] == "context_length_exceeded"


def test_huge_bodies_are_413(client: httpx.Client, bus_quiet: None) -> None:
    huge = {"messages": [{"role": "user", "content": "x" * 100_000}]}  # the limit is 64 KiB
    assert_openai_error(client.post(CHAT, json=huge), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the gateway must count as it reads
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}]}'

    assert_openai_error(
        client.post(CHAT, content=chunks(), headers={"content-type": "application/json"}), 413
    )


def test_lying_content_length_is_refused_before_reading(client: httpx.Client) -> None:
    host, port = client.base_url.host, client.base_url.port or 80
    with socket.create_connection((host, port), timeout=5) as sock:
        head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += "Content-Length: 999999999\r\n\r\n"
        sock.sendall(head.encode())
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413")
