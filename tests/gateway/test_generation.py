"""Chat and text completions end to end: gateway under uvicorn, real nats-server, scripted pipeline."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.gateway.scripted import FakeTokenizer, ScriptedPipeline

CHAT = "/v1/chat/completions"


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of an SSE response, JSON-decoded, with `[DONE]` kept as a string."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_chat_non_stream_maps_every_sampling_field(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "max_completion_tokens": 20,
        "max_tokens": 99,  # max_completion_tokens wins
        "stop": "END",
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "ignore_eos": True,
        "min_tokens": 2,
        "user": "someone",
        "some_future_field": {"ignored": True},
    }
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert data["model"] == "smollm2-135m-instruct" and isinstance(data["created"], int)
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello world!"}  # duplicates dropped
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    request = pipeline.requests[-1]
    assert request.request_id == data["id"] and request.model == "smollm2-135m-instruct"
    assert pipeline.prompt_text() == "<|system|> be brief <|user|> hi there <|assistant|>"
    assert data["usage"] == {"prompt_tokens": len(request.prompt_token_ids), "completion_tokens": 3,
                             "total_tokens": len(request.prompt_token_ids) + 3,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    sampling = request.sampling
    assert abs(sampling.temperature - 0.5) < 1e-6 and abs(sampling.top_p - 0.9) < 1e-6
    assert (sampling.top_k, sampling.max_tokens, sampling.seed, sampling.min_tokens) == (40, 20, 7, 2)
    assert list(sampling.stop) == ["END"] and sampling.ignore_eos
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    assert not sampling.HasField("logprobs")


def test_chat_stream_sends_role_tokens_finish_usage_and_done(client: httpx.Client) -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "you"}]}
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello world!"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_stream_without_include_usage_has_no_usage_chunk(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2}
    with client.stream("POST", CHAT, json=body) as response:
        chunks = sse_events(response)[:-1]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_events_out_of_order_reach_the_client_in_order(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "shuffle please"}], "stream": True}
    with client.stream("POST", CHAT, json=body) as response:
        chunks = sse_events(response)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello world!"


def test_chat_logprobs(client: httpx.Client, pipeline: ScriptedPipeline, tokenizer: FakeTokenizer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    data = client.post(CHAT, json=body).json()
    assert pipeline.requests[-1].sampling.logprobs == 2
    content = data["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == ["Hello", "world", "!"]
    assert content[0]["logprob"] == -0.25 and content[0]["bytes"] == list(b"Hello")
    assert [top["token"] for top in content[0]["top_logprobs"]] == ["alt0", "alt1"]

    body["stream"] = True
    with client.stream("POST", CHAT, json=body) as response:
        chunks = sse_events(response)[:-1]
    streamed = [
        c["choices"][0]["logprobs"]["content"][0]["token"] for c in chunks if c["choices"][0].get("logprobs")
    ]
    assert streamed == ["Hello", "world", "!"]


def test_completions_with_text_and_token_ids(client: httpx.Client, pipeline: ScriptedPipeline) -> None:
    data = client.post("/v1/completions", json={"prompt": "once upon", "max_tokens": 5}).json()
    assert data["id"].startswith("cmpl-") and data["object"] == "text_completion"
    assert data["choices"][0]["text"] == "Hello world!" and data["choices"][0]["finish_reason"] == "stop"
    assert pipeline.prompt_text() == "<bos> once upon"

    data = client.post("/v1/completions", json={"prompt": [5, 6, 7], "logprobs": 1}).json()
    assert list(pipeline.requests[-1].prompt_token_ids) == [5, 6, 7]
    logprobs = data["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Hello", "world", "!"]
    assert logprobs["token_logprobs"] == [-0.25, -0.5, -0.75]
    assert logprobs["top_logprobs"][0] == {"alt0": -1.0} and logprobs["text_offset"] == [0, 5, 11]
    assert data["usage"]["prompt_tokens"] == 3


def test_completions_stream(client: httpx.Client) -> None:
    body = {"prompt": ["a batch of one"], "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as response:
        events = sse_events(response)
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hello world!"
    assert chunks[-1]["usage"]["total_tokens"] > 3


def test_engine_error_before_any_token_has_its_own_status(client: httpx.Client) -> None:
    for stream in (False, True):
        body = {"messages": [{"role": "user", "content": "error"}], "stream": stream}
        response = client.post(CHAT, json=body)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "prompt refused"


def test_engine_error_mid_stream_becomes_an_error_event(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "lateerror"}], "stream": True}
    with client.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["message"] == "stage lost" and events[-2]["error"]["type"] == "server_error"
    assert events[1]["choices"][0]["delta"]["content"] == "Hello"


def test_models(client: httpx.Client) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["smollm2-135m-instruct"]
    assert data["data"][0]["max_model_len"] == 64
    assert client.get("/v1/models/smollm2-135m-instruct").json()["id"] == "smollm2-135m-instruct"
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
