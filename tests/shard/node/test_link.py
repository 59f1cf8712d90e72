"""`StageLink` on a real nats-server: who may send what to whom, and revocation taking effect on send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.frames import KIND_ACTIVATIONS, KIND_RESULT, activation_payload, encode_frames
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.certificates import read_body
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle, revoke
from mohawk_proto.v1 import bus_pb2, engine_pb2, security_pb2
from mohawk_shard.node.link import StageLink
from mohawk_shard.node.pipeline_view import PipelineView

NODES = ("shard-a", "shard-b", "shard-c")
PLAN = bus_pb2.Plan(
    version=5,
    model="m",
    stages=[bus_pb2.PlanStage(node_id=node, start=i, end=i + 1) for i, node in enumerate(NODES)],
)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_pki(tmp_path / "pki")
    for node in NODES:
        issue_node(tmp_path / "pki", node, "shard")
    return tmp_path / "pki"


def security(pki: Path, node: str) -> Security:
    return Security(load_bundle(pki / "nodes" / node, role="shard"), CryptographyKem(), role="shard")


@dataclass
class Stage:
    nc: Client
    security: Security
    link: StageLink
    inbox: list[bytes]  # every message published to this stage's activation subject


@asynccontextmanager
async def pipeline(url: str, pki: Path) -> AsyncIterator[list[Stage]]:
    """The three stages of PLAN, each on its own connection, each recording what reaches it."""
    stages: list[Stage] = []
    try:
        for index, node in enumerate(NODES):
            nc = await connect([url], name=node, attempts=3)
            sec = security(pki, node)
            link = StageLink(nc, sec, node_id=node, view=PipelineView(PLAN), stage=index)
            inbox: list[bytes] = []

            async def record(msg: Msg, inbox: list[bytes] = inbox) -> None:
                inbox.append(msg.data)

            await nc.subscribe(names.activation_subject(node, PLAN.version, 0, index), cb=record)
            await link.start()
            await server_has_all(nc)
            stages.append(Stage(nc, sec, link, inbox))
        yield stages
    finally:
        for stage in stages:
            await stage.link.stop()
            await stage.nc.close()


async def settle(*stages: Stage) -> None:
    """Every message published so far has been delivered (a round trip on each connection)."""
    for stage in stages:
        await server_has_all(stage.nc)
    await asyncio.sleep(0.2)


def step(step_id: int) -> engine_pb2.StepBatch:
    return engine_pb2.StepBatch(step_id=step_id)


def test_a_revoked_downstream_stage_receives_nothing_from_the_next_send_on(
    nats_server: NatsServer, pki: Path
) -> None:
    """Stage 0 streams activations to stage 1; the operator revokes stage 1's certificate (a new
    list in the `mohawk_pki` bucket, followed by stage 0). The next send is refused and counted,
    the channel dropped, a fresh handshake refused too, and stage 1 receives no further message."""

    async def scenario() -> None:
        async with pipeline(nats_server.url, pki) as (a, b, _c):
            buckets = await ensure_buckets(a.nc.jetstream())
            follow = asyncio.create_task(a.security.follow_revocations(buckets.pki))
            try:
                for step_id in range(3):
                    await a.link.send_activations(step(step_id), "", [], b"hidden")
                await settle(a, b)
                assert len(b.inbox) == 3
                assert all(b.link.receive(m) is not None for m in b.inbox)  # opened on the channel

                serial = read_body(b.security.require().identity.certificate).serial
                crl = revoke(pki, [serial])
                await buckets.pki.put(names.CRL_KEY, crl.SerializeToString())
                trust = a.security.require().trust
                for _ in range(100):
                    if serial in trust.revoked:
                        break
                    await asyncio.sleep(0.05)
                assert serial in trust.revoked

                for step_id in range(3, 6):  # the cached channel, then fresh handshakes: all refused
                    with pytest.raises(AuthenticationError) as refused:
                        await a.link.send_activations(step(step_id), "", [], b"hidden")
                    assert refused.value.reason == "revoked"
                await settle(a, b)
                assert len(b.inbox) == 3  # nothing more reached the revoked stage
                assert a.security.rejections["revoked"] >= 3
            finally:
                await cancel_and_wait(follow)

    asyncio.run(scenario())


async def send_as(sender: Stage, receiver: int, kind: int, payload: bytes) -> None:
    """A frame of `kind` from `sender` to stage `receiver`, sealed on their channel: what a stage
    running modified code could put on the bus."""
    channel = await sender.link.channels.channel_to(NODES[receiver])
    header = security_pb2.FrameHeader(plan_version=PLAN.version, stage=receiver, step_id=9, kind=kind)
    for message in encode_frames(header, payload, sender.nc.max_payload, channel):
        await sender.nc.publish(names.activation_subject(NODES[receiver], PLAN.version, 0, receiver), message)


def test_channels_and_frame_kinds_follow_the_pipelines_positions(nats_server: NatsServer, pki: Path) -> None:
    """Stage i opens to i+1 and stage 0 to the last; a middle stage cannot open a channel to stage
    0; over the channels that exist, each kind is accepted only from the stage that sends it."""

    async def scenario() -> None:
        async with pipeline(nats_server.url, pki) as (a, b, c):
            await a.link.connect_neighbours()  # 0 -> 1 and 0 -> 2
            await b.link.connect_neighbours()  # 1 -> 2

            # the middle stage offers stage 0 a channel of its own: refused and counted at stage 0
            with pytest.raises(AuthenticationError):
                await b.link.channels._initiate("shard-a")
            assert a.security.rejections["out_of_position"] == 1

            # what each stage sends in its place arrives and opens
            await a.link.send_activations(step(1), "", [], b"h")
            await b.link.send_activations(step(1), "", [], b"h")
            await c.link.send_result(bus_pb2.StepResult(plan_version=PLAN.version, step_id=1))
            await settle(a, b, c)
            assert [len(s.inbox) for s in (a, b, c)] == [1, 1, 1]
            assert all(s.link.receive(s.inbox[0]) is not None for s in (a, b, c))

            # a step result from the middle stage straight to stage 0 (over the 0-1 channel)...
            await b.link.send_result(bus_pb2.StepResult(plan_version=PLAN.version, step_id=2))
            # ...activations from the last stage to stage 0, a result from the last stage to stage 1,
            await send_as(c, 0, KIND_ACTIVATIONS, activation_payload(step(2), b"h"))
            await send_as(c, 1, KIND_RESULT, bus_pb2.StepResult(step_id=2).SerializeToString())
            # ...and activations backwards, stage 1 to stage 0: each refused where it lands, counted
            await send_as(b, 0, KIND_ACTIVATIONS, activation_payload(step(2), b"h"))
            await settle(a, b, c)
            assert [len(s.inbox) for s in (a, b, c)] == [4, 2, 1]
            assert all(a.link.receive(m) is None for m in a.inbox[1:])
            assert b.link.receive(b.inbox[1]) is None
            assert a.security.rejections["out_of_position"] == 1 + 3
            assert b.security.rejections["out_of_position"] == 1

    asyncio.run(scenario())
