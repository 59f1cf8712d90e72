"""One request against the gateway: 429s waited out and retried, the answer read, timed and classified.

Design. A request is sent until it is answered with something other than a 429. A 429 is recorded
(tenant, code, its Retry-After, whether it carried x-ratelimit-* headers) and waited out: never
sooner than Retry-After says, plus a random spread that grows with the request's consecutive
refusals (up to `MAX_SPREAD_S`), so refused clients do not all come back in the same instant. A
429 without Retry-After (no wait would admit it), or refusals past `max_wait_s` of waiting in all,
end the request as `http_429:<code>`. A streamed answer is read line by line: text chunks are
timed, the usage chunk gives the token count, an error event ends it as `stream_<status>:<code>`,
and a stream that stops before `[DONE]` and a finish reason is `lost`. httpx's read timeout is the
stall timeout, so a request with no byte of its answer for that long ends as `hung`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.measure import Recorder, RequestLog, stream_error_kind

MAX_SPREAD_S = 4.0
DONE = "[DONE]"


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Mapping[str, Any] | None = None
    stream: bool = False


class _Refused(Exception):
    def __init__(
        self, code: str | None, retry_after_s: float | None, has_headers: bool, reason: str | None
    ) -> None:
        super().__init__(code)
        self.code = code
        self.retry_after_s = retry_after_s
        self.has_headers = has_headers
        self.reason = reason  # the gateway's X-Mohawk-Refusal


class _Failed(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def send(
    client: httpx.AsyncClient,
    recorder: Recorder,
    log: RequestLog,
    call: Call,
    *,
    api_key: str,
    max_wait_s: float,
    rng: random.Random,
) -> dict[str, Any] | None:
    """Run `call` with `api_key` to its end, recorded in `log`; the JSON body of a plain answer
    (None when it failed, and for a stream)."""
    headers = {"Authorization": f"Bearer {api_key}"}
    waited = 0.0
    body: dict[str, Any] | None = None
    while True:
        log.sent_at = recorder.now()
        try:
            if call.stream:
                await _stream(client, recorder, log, call, headers)
            else:
                body = await _request(client, call, headers)
        except _Refused as refusal:
            recorder.refused(log, refusal.code, refusal.retry_after_s, refusal.has_headers, refusal.reason)
            if refusal.retry_after_s is None or waited >= max_wait_s:
                recorder.end(log, f"http_429:{refusal.code}")
                return None
            spread = rng.uniform(0.0, min(MAX_SPREAD_S, 2.0 ** min(log.num_refusals, 8)))
            await asyncio.sleep(refusal.retry_after_s + spread)
            waited += refusal.retry_after_s + spread
            continue
        except _Failed as failure:
            recorder.end(log, failure.kind)
            return None
        except httpx.ReadTimeout:
            recorder.end(log, "hung")
            return None
        except httpx.TimeoutException:
            recorder.end(log, "timeout")
            return None
        except httpx.TransportError as exc:
            recorder.end(log, f"transport:{type(exc).__name__}")
            return None
        recorder.end(log)
        return body


async def _request(client: httpx.AsyncClient, call: Call, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.request(call.method, call.path, json=call.body, headers=headers)
    if not response.is_success:
        _raise_for(response)
    try:
        body = response.json() if response.content else {}
    except json.JSONDecodeError as exc:
        raise _Failed("bad_answer") from exc
    return body if isinstance(body, dict) else {}


async def _stream(
    client: httpx.AsyncClient, recorder: Recorder, log: RequestLog, call: Call, headers: dict[str, str]
) -> None:
    async with client.stream(call.method, call.path, json=call.body, headers=headers) as response:
        if not response.is_success:
            await response.aread()
            _raise_for(response)
        finished = done = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == DONE:
                done = True
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError as exc:
                raise _Failed("bad_answer") from exc
            finished |= _take_chunk(chunk if isinstance(chunk, dict) else {}, recorder, log)
    if not (done and finished):
        raise _Failed("lost")


def _take_chunk(chunk: dict[str, Any], recorder: Recorder, log: RequestLog) -> bool:
    """Record one chunk's text and usage; whether it carried a finish reason. An error event
    raises."""
    if "error" in chunk:
        raise _Failed(stream_error_kind(chunk["error"]))
    usage = chunk.get("usage")
    if usage:
        log.num_tokens = int(usage.get("completion_tokens", 0))
        log.num_prompt_tokens = int(usage.get("prompt_tokens", 0))
        details = usage.get("prompt_tokens_details") or {}
        log.num_cached_tokens = int(details.get("cached_tokens") or 0)
    finished = False
    for choice in chunk.get("choices") or ():
        if (choice.get("delta") or {}).get("content"):
            now = recorder.now()
            if log.first_token_at is None:
                log.first_token_at = now
            log.chunk_times.append(now)
        finished |= bool(choice.get("finish_reason"))
    return finished


def _raise_for(response: httpx.Response) -> None:
    code = _error_code(response)
    if response.status_code == 429:
        has_headers = any(name.lower().startswith("x-ratelimit-") for name in response.headers)
        retry_after = _retry_after(response.headers.get("retry-after"))
        raise _Refused(code, retry_after, has_headers, response.headers.get("x-mohawk-refusal"))
    raise _Failed(f"http_{response.status_code}:{code}")


def _error_code(response: httpx.Response) -> str | None:
    try:
        error = response.json().get("error") or {}
    except (json.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return None if code is None else str(code)


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (the gateway sends whole seconds); None when absent or not a number."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
