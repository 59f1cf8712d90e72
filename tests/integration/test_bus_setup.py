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


def test_every_stream_and_bucket_is_bounded(nats_server: NatsServer) -> None:
    """No client the bus lets publish can fill the server's disk: each stream has a byte and a
    message bound, each bucket a byte and a value-size bound; past a bucket's value size a write
    is refused, and the token stream drops its oldest events past its bounds."""
    limits = BusLimits(tokens_max_msgs=3, bucket_max_value_bytes=1024)

    async def scenario() -> None:
        nc = await connect(nats_server.url, name="test")
        js = nc.jetstream()
        await ensure_streams(js, limits)
        buckets = await ensure_buckets(js, limits)
        for stream in (names.REQUESTS_STREAM, names.TOKENS_STREAM):
            config = (await js.stream_info(stream)).config
            assert config.max_bytes and config.max_bytes > 0, stream
            assert config.max_msgs and config.max_msgs > 0, stream
        for bucket in (buckets.leader, buckets.nodes, buckets.plan, buckets.pki, buckets.gateways):
            status = await bucket.status()
            assert status.stream_info.config.max_bytes == limits.bucket_max_bytes
            assert status.stream_info.config.max_msg_size == 1024
        with pytest.raises(APIError):
            await buckets.plan.put(names.PLAN_KEY, b"x" * 2048)
        for i in range(5):
            await js.publish(names.token_subject(f"r{i}"), b"event")
        tokens = (await js.stream_info(names.TOKENS_STREAM)).state
        assert tokens.messages == 3 and tokens.first_seq == 3  # the oldest two dropped
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
    assert names.activation_subject("shard-4", 3, 2, 1) == "mohawk.v1.act.shard-4.3.2.1"
