"""The bus layer against a real nats-server: streams, buckets, dedupe, the request bound, retries."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import APIError

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.bus.setup import BusLimits, ensure_buckets, ensure_streams


def test_streams_dedupe_requests_and_bound_the_queue(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        await ensure_streams(js, BusLimits(max_queued_requests=2))
        await ensure_streams(js, BusLimits(max_queued_requests=2))  # idempotent
        subject = names.request_subject("SmolLM2 135M")
        assert subject == "mohawk.v1.req.smollm2-135m"
        first = await js.publish(subject, b"a", headers={"Nats-Msg-Id": "r1"})
        again = await js.publish(subject, b"a", headers={"Nats-Msg-Id": "r1"})
        assert again.duplicate and again.seq == first.seq
        await js.publish(subject, b"b", headers={"Nats-Msg-Id": "r2"})
        with pytest.raises(APIError):
            await js.publish(subject, b"c", headers={"Nats-Msg-Id": "r3"})
        buckets = await ensure_buckets(js)
        await buckets.plan.put(names.PLAN_KEY, b"{}")
        assert (await buckets.plan.get(names.PLAN_KEY)).value == b"{}"
        await nc.close()

    asyncio.run(scenario())


def test_connect_retries_until_the_server_comes_up(tmp_path) -> None:
    server = NatsServer(tmp_path / "late", port=free_port())

    async def scenario() -> None:
        task = asyncio.create_task(connect(server.url, name="late"))
        await asyncio.sleep(0.8)
        assert not task.done()
        server.start()
        nc = await asyncio.wait_for(task, 10)
        assert nc.is_connected
        await nc.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_ids_that_would_break_subjects_are_refused() -> None:
    with pytest.raises(ValueError):
        names.token_subject("a.b")
    assert names.activation_subject(3, 2, 1) == "mohawk.v1.act.3.2.1"
