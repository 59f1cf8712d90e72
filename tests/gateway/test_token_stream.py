"""`TokenStream`: each index exactly once and in order; gaps and silences are filled from JetStream."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_gateway.bus import BusClient
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.tokens import TokenStream
from mohawk_pqc.kem import CryptographyKem
from mohawk_proto.v1 import engine_pb2

RID = "req-1"


def event(index: int, text: str = "", finish: str = "", **fields: Any) -> engine_pb2.TokenEvent:
    fields.setdefault("request_id", RID)
    return engine_pb2.TokenEvent(index=index, text=text or f"t{index}", finish_reason=finish, **fields)


async def feed(stream: TokenStream, *events: engine_pb2.TokenEvent) -> None:
    for e in events:
        await stream.on_message(SimpleNamespace(data=e.SerializeToString()))  # type: ignore[arg-type]


async def drain(stream: TokenStream, timeout: float = 2.0) -> list[engine_pb2.TokenEvent]:
    deadline = asyncio.get_running_loop().time() + timeout
    out = [await stream.next(deadline)]
    while not (out[-1].finish_reason or out[-1].error):
        out.append(await stream.next(deadline))
    return out


def new_stream(replayed: list[engine_pb2.TokenEvent] | None = None, **kwargs: Any) -> TokenStream:
    async def replay(request_id: str) -> list[engine_pb2.TokenEvent]:
        return list(replayed or [])

    kwargs.setdefault("gap_wait_s", 0.05)
    kwargs.setdefault("idle_probe_s", 0.1)
    return TokenStream(RID, replay, **kwargs)


def test_duplicates_dropped_and_order_restored() -> None:
    async def scenario() -> None:
        duplicates: list[int] = []
        stream = new_stream(on_duplicate=lambda: duplicates.append(1))
        await feed(stream, event(1), event(0), event(0), event(1), b := event(2, finish="stop"))
        await feed(stream, event(9, request_id="other"), b)
        got = await drain(stream)
        assert [e.index for e in got] == [0, 1, 2]
        assert len(duplicates) == 2

    asyncio.run(scenario())


def test_a_finish_repeated_for_a_delivered_index_ends_the_stream() -> None:
    async def scenario() -> None:
        stream = new_stream()
        await feed(stream, event(0), event(1))
        deadline = asyncio.get_running_loop().time() + 1
        assert [(await stream.next(deadline)).index for _ in range(2)] == [0, 1]
        final = event(1, finish="length")
        final.usage.completion_tokens = 2
        await feed(stream, final)  # a recovered pipeline re-sends index 1, now with the finish
        last = await stream.next(deadline)
        assert last.finish_reason == "length" and last.text == "" and last.usage.completion_tokens == 2

    asyncio.run(scenario())


def test_error_event_ends_at_once_and_garbage_is_skipped() -> None:
    async def scenario() -> None:
        stream = new_stream()
        await stream.on_message(SimpleNamespace(data=b"\xff\xff not protobuf"))  # type: ignore[arg-type]
        await feed(
            stream, event(3), engine_pb2.TokenEvent(request_id=RID, index=5, error="boom", error_status=400)
        )
        got = await drain(stream)
        assert got[-1].error == "boom" and len(got) == 1

    asyncio.run(scenario())


def test_gap_and_silence_are_filled_by_replay_and_the_deadline_holds() -> None:
    async def scenario() -> None:
        stored = [event(0), event(1), event(2, finish="stop")]
        gap = new_stream(stored)
        await feed(gap, event(2, finish="stop"))  # 0 and 1 were lost on the way
        assert [e.index for e in await drain(gap)] == [0, 1, 2]

        silent = new_stream(stored)  # everything was lost, the last event included
        assert [e.index for e in await drain(silent)] == [0, 1, 2]

        nothing = new_stream([])
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await nothing.next(started + 0.3)
        assert loop.time() - started < 1.0

    asyncio.run(scenario())


def test_token_log_reads_the_request_events_back_from_jetstream_from_its_cursor(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        settings = GatewaySettings.model_validate({"nats_url": nats_server.url, "insecure": True})
        bus = BusClient(settings, Security(None, CryptographyKem(), role="gateway"))
        bus.start()
        while not bus.connected:
            await asyncio.sleep(0.02)
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        for e in (event(0), event(1), event(2, finish="stop")):
            await js.publish(names.token_subject(RID), e.SerializeToString())
        await js.publish(names.token_subject("req-2"), event(0).SerializeToString())
        reader = bus.token_log(RID)
        stream = TokenStream(RID, lambda _: reader.read_new(), gap_wait_s=0.05, idle_probe_s=0.1)
        await bus.subscribe_tokens(RID, stream.on_message)
        await js.publish(names.token_subject(RID), event(2, finish="stop").SerializeToString())
        got = await drain(stream)
        assert [e.index for e in got] == [0, 1, 2]
        # a fresh reader reads everything in one pass; a used one only what came after its cursor
        assert [e.index for e in await bus.token_log(RID).read_new()] == [0, 1, 2, 2]
        await reader.read_new()
        assert await reader.read_new() == []
        await js.publish(names.token_subject(RID), event(3).SerializeToString())
        assert [e.index for e in await reader.read_new()] == [3]
        await nc.close()
        await bus.close()

    asyncio.run(scenario())
