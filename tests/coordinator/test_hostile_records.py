"""Records a holder of the coordinators' bus credential can write into the plan key, against a real
nats-server and a certified leader: none stops it, none is adopted, none uses up plan versions.

Each record is written, then a node joins or leaves so the leader must write a new plan (and so
read the key): it plans on, signed, numbered on from the versions it signed. Then the replay: an
old signed plan put back, with the key's history purged first so only the leader's own memory
(`high_water.py`) knows how far the versions went, across a restart of the replica.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.js.errors import KeyNotFoundError

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control_records import RecordVerifier
from mohawk_common.bus.plan_follower import MAX_PLAN_VERSION, parse_plan
from mohawk_common.bus.security import Security
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import Buckets
from mohawk_coordinator.high_water import PlanHighWater
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.pki_files import load_bundle
from mohawk_proto.v1 import bus_pb2
from tests.coordinator.fake_node import FakeNode
from tests.coordinator.harness import Replica, issue_pki, start_secure_replica

HOSTILE = {
    "version 2**63-1": b'{"version": "9223372036854775807", "model": "tiny-llama"}',
    "version -5": b'{"version": "-5", "model": "tiny-llama"}',
    "version 2**53": b'{"version": "9007199254740992"}',
    "not JSON": b"\x00\xffnot json at all",
    "wrong types": b'{"version": "many", "stages": 7}',
    "no version": b"{}",
}


async def signed_plan(
    buckets: Buckets, verifier: RecordVerifier, stages: int, newer_than: int
) -> bus_pb2.Plan:
    """The next plan a coordinator signed with `stages` stages above version `newer_than`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            entry = await buckets.plan.get(names.PLAN_KEY)
            plan = parse_plan(entry.value or b"")
            verifier.verify(plan, "plan")
        except (KeyNotFoundError, AuthenticationError):
            plan = None
        if plan is not None and len(plan.stages) == stages and plan.version > newer_than:
            return plan
        await asyncio.sleep(0.02)
    raise AssertionError(f"no signed plan of {stages} stages above version {newer_than} in 10 s")


def test_no_record_in_the_plan_key_stops_the_leader_or_uses_up_versions(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    identities = issue_pki(tmp_path, "node-0", "node-1")
    verifier = RecordVerifier(load_bundle(tmp_path / "nodes" / "node-0", role="shard").trust)
    state_dir = tmp_path / "coordinator-state"

    async def start() -> tuple[Replica, Security, Buckets]:
        started = await start_secure_replica(nats_server.url, tmp_path, "coord-a", state_dir=state_dir)
        return started.replica, started.security, started.buckets

    async def scenario() -> None:
        replica, security, buckets = await start()
        nodes_nc = await connect(nats_server.url, name="nodes")
        first = await FakeNode(nodes_nc, "node-0", identity=identities["node-0"]).start()
        plan = await signed_plan(buckets, verifier, 1, 0)

        second: FakeNode | None = None
        for what, record in HOSTILE.items():
            await buckets.plan.put(names.PLAN_KEY, record)
            await nodes_nc.publish(names.heartbeat_subject("node-1"), record)  # on the heartbeats too
            if second is None:  # a node joins: the leader must write a plan of two stages
                second = await FakeNode(nodes_nc, "node-1", identity=identities["node-1"]).start()
            else:  # it leaves: one stage
                await second.stop()
                second = None
            stages = 1 if second is None else 2
            newer = await signed_plan(buckets, verifier, stages, plan.version)
            assert newer.version <= plan.version + 2, (what, newer.version)  # counted on from its own
            assert not replica.task.done(), what
            plan = newer
        assert security.rejections["malformed"] >= len(HOSTILE)
        assert replica.coordinator.num_failed_steps == 0  # each was refused where it is read
        highest = plan.version
        assert PlanHighWater(state_dir).value == highest  # remembered on the replica's own disk

        # the replay: the first signed plan put back, its newer history purged, the replica
        # restarted; it neither adopts the old plan nor counts from it
        history = [e for e in await buckets.plan.history(names.PLAN_KEY) if e.value]
        oldest_signed = next(e.value for e in history if e.value and b'"signed"' in e.value)
        assert parse_plan(oldest_signed).version < highest
        await replica.stop()
        plan_kv = await nodes_nc.jetstream().key_value(names.PLAN_BUCKET)
        await plan_kv.purge(names.PLAN_KEY)
        await plan_kv.put(names.PLAN_KEY, oldest_signed)
        replica, security, buckets = await start()
        if second is None:
            second = await FakeNode(nodes_nc, "node-1", identity=identities["node-1"]).start()
        else:
            await second.stop()
            second = None
        after = await signed_plan(buckets, verifier, 1 if second is None else 2, highest)
        assert highest < after.version <= MAX_PLAN_VERSION
        assert security.rejections["replayed"] >= 1
        assert not replica.task.done()
        await replica.stop()
        for node in (first, second):
            if node is not None:
                await node.stop()
        await nodes_nc.close()

    asyncio.run(scenario())


def test_the_high_water_mark_survives_a_restart_and_never_goes_down(tmp_path: Path) -> None:
    mark = PlanHighWater(tmp_path / "state")
    assert mark.value == 0  # nothing kept yet
    mark.raise_to(7)
    mark.raise_to(3)  # lower: ignored
    mark.raise_to(MAX_PLAN_VERSION + 1)  # out of bounds: ignored
    assert PlanHighWater(tmp_path / "state").value == 7
    (tmp_path / "state" / "plan-high-water").write_text("not a number\n")
    assert PlanHighWater(tmp_path / "state").value == 0  # reported, counted from the key's history
    assert PlanHighWater(None).value == 0
