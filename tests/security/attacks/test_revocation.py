"""Revocation under load, on a real 3-node cluster with NATS auth: `mohawk pki revoke` of the middle
stage while 16 greedy streams run. Stage 0 stops sending to it as soon as it adopts the list (the
check before every send), the coordinator stops trusting its heartbeats and plans without it, and
every accepted request still finishes. Prints the time from the revocation to the last message the
revoked node was sent (docs/security.md, "revocation to silence")."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_cli.pki import revoke_and_publish
from mohawk_common.bus import names
from mohawk_common.bus.server import free_port
from mohawk_common.bus.setup import BusLimits
from mohawk_pqc.pki_files import load_bundle
from tests.integration.cluster_helpers import current_plan, stream_many, wait_for_stages
from tests.security.attacks.bus_client import BusClient

NUM_STREAMS = 16
MAX_TOKENS = 48
REPLAN_TIMEOUT_S = 60.0


@pytest.mark.slow
def test_a_node_revoked_under_16_streams_is_sent_nothing_more_and_no_request_is_lost(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=3, port=free_port(), nats_port=free_port(), data_dir=tmp_path, nats_auth=True)
    with LocalCluster(spec) as cluster:
        cluster.wait_ready(timeout=300)
        plan = wait_for_stages(cluster, 3)
        revoked = plan.stages[1].node_id
        pipeline = plan.pipelines[0]
        into_revoked = {
            names.activation_subject(pipeline.epoch, pipeline.id, 1),
            names.handshake_subject(revoked),
        }
        serial = load_bundle(cluster.pki_dir / "nodes" / revoked, role="shard").identity.body.serial
        sent_to_revoked: list[float] = []

        with BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as watcher:

            async def on_message(msg: Msg) -> None:
                if msg.subject in into_revoked:
                    sent_to_revoked.append(time.monotonic())

            watcher.run(watcher.nc.subscribe(f"{names.PREFIX}.>", cb=on_message))
            with ThreadPoolExecutor(1) as pool:
                prompts = [f"Write a short story about the number {i}." for i in range(NUM_STREAMS)]
                streams = pool.submit(stream_many, cluster.url, prompts, MAX_TOKENS)
                deadline = time.monotonic() + 120
                while len(sent_to_revoked) < 20 and time.monotonic() < deadline:  # streaming
                    time.sleep(0.05)
                revoked_at = time.monotonic()
                admin = cluster.nats_creds("admin")
                asyncio.run(
                    revoke_and_publish(
                        cluster.pki_dir, [serial], [cluster.nats.url], BusLimits(), creds=admin
                    )
                )
                results = streams.result(timeout=600)
            replanned = _wait_for_plan_without(cluster, revoked)

        silence_s = max(sent_to_revoked, default=revoked_at) - revoked_at
        print(f"\nrevocation to silence: {silence_s:.3f} s; plan without {revoked}: version {replanned}")
        assert [finish for _, finish in results] == ["length"] * NUM_STREAMS, results
        assert all(text for text, _ in results)
        assert sent_to_revoked and sent_to_revoked[-1] < revoked_at + REPLAN_TIMEOUT_S


def _wait_for_plan_without(cluster: LocalCluster, node_id: str) -> int:
    deadline = time.monotonic() + REPLAN_TIMEOUT_S
    while time.monotonic() < deadline:
        plan = current_plan(cluster.nats.url, creds=cluster.nats_creds("ops"))
        if plan is not None and node_id not in {s.node_id for s in plan.stages}:
            return plan.version
        time.sleep(0.2)
    raise AssertionError(f"no plan without the revoked {node_id} within {REPLAN_TIMEOUT_S:.0f} s")
