"""Revocation under load, on a real 3-node cluster with a NATS user per process: `mohawk pki revoke
--nats-url` (the command itself) of the middle stage while 16 greedy streams run. The servers drop
the revoked node's bus connection at once and refuse its credential; stage 0 stops sending to it as
soon as it adopts the list (the check before every send); the coordinator plans without it; and
every accepted request finishes with the text the same prompts gave before. Prints the time from
the command's start to the node's connection closed, and to the last message the revoked node was
sent (docs/security.md, "revocation to silence")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import free_port
from mohawk_pqc.pki_files import load_bundle
from tests.integration.cluster_helpers import current_plan, stream_many, wait_for_stages
from tests.security.attacks.bus_client import BusClient

NUM_STREAMS = 16
MAX_TOKENS = 48
REPLAN_TIMEOUT_S = 60.0


DROPPED_WITHIN_S = 5.0


@pytest.mark.slow
def test_a_node_revoked_under_16_streams_is_dropped_from_the_bus_and_no_request_is_lost(
    tmp_path: Path,
) -> None:
    spec = ClusterSpec(nodes=3, port=free_port(), nats_port=free_port(), data_dir=tmp_path, nats_auth=True)
    with LocalCluster(spec) as cluster:
        cluster.wait_ready(timeout=300)
        plan = wait_for_stages(cluster, 3)
        revoked = plan.stages[1].node_id
        pipeline = plan.pipelines[0]
        into_revoked = names.activation_subject(revoked, pipeline.epoch, pipeline.id, 1)
        offers_to_revoked = names.handshakes_to(revoked)[: -len("*")]
        serial = load_bundle(cluster.pki_dir / "nodes" / revoked, role="shard").identity.body.serial
        prompts = [f"Write a short story about the number {i}." for i in range(NUM_STREAMS)]
        reference = stream_many(cluster.url, prompts, MAX_TOKENS)
        assert connection_of(cluster, revoked) is not None
        sent_to_revoked: list[float] = []

        with BusClient(cluster.nats.url, creds=cluster.nats_creds("ops")) as watcher:

            async def on_message(msg: Msg) -> None:
                if msg.subject == into_revoked or msg.subject.startswith(offers_to_revoked):
                    sent_to_revoked.append(time.monotonic())

            watcher.run(watcher.nc.subscribe(f"{names.PREFIX}.>", cb=on_message))
            with ThreadPoolExecutor(1) as pool:
                streams = pool.submit(stream_many, cluster.url, prompts, MAX_TOKENS)
                deadline = time.monotonic() + 120
                while len(sent_to_revoked) < 20 and time.monotonic() < deadline:  # streaming
                    time.sleep(0.05)
                revoked_at = time.monotonic()
                command = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "mohawk_cli", "pki", "revoke", "--serial", str(serial)),
                        *("--pki-dir", str(cluster.pki_dir), "--nats-url", cluster.nats.url),
                        *("--creds", str(cluster.nats_creds("admin"))),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=dict(os.environ),
                )
                while connection_of(cluster, revoked) is not None:
                    assert time.monotonic() - revoked_at < DROPPED_WITHIN_S * 4, "still connected"
                    time.sleep(0.01)
                dropped_s = time.monotonic() - revoked_at
                refused = refused_reason(cluster, revoked)
                refused_s = time.monotonic() - revoked_at
                _, err = command.communicate(timeout=60)
                assert command.returncode == 0, err.decode()
                results = streams.result(timeout=600)
            replanned = _wait_for_plan_without(cluster, revoked)

        silence_s = max(sent_to_revoked, default=revoked_at) - revoked_at
        print(
            f"\nrevoke command to {revoked}'s bus connection closed: {dropped_s:.3f} s, its credential "
            f"refused: {refused_s:.3f} s; to silence: {silence_s:.3f} s; plan without it: version {replanned}"
        )
        assert dropped_s < DROPPED_WITHIN_S and refused_s < DROPPED_WITHIN_S
        assert "authorization violation" in refused.lower(), refused
        assert results == reference  # 16/16 finished, each with the text it had before
        assert [finish for _, finish in results] == ["length"] * NUM_STREAMS, results
        assert sent_to_revoked and sent_to_revoked[-1] < revoked_at + REPLAN_TIMEOUT_S


def connection_of(cluster: LocalCluster, node_id: str) -> dict[str, object] | None:
    """The node's connection as nats-server lists it (`/connz`: its shard service names it)."""
    assert cluster.nats.monitor_url is not None
    with urllib.request.urlopen(f"{cluster.nats.monitor_url}/connz?limit=1024", timeout=5) as response:
        connections = json.loads(response.read())["connections"] or []
    return next((c for c in connections if c.get("name") == f"shard-{node_id}"), None)


def refused_reason(cluster: LocalCluster, node_id: str) -> str:
    """What nats-server says to one connection attempt with the node's own credential."""
    try:
        nc = asyncio.run(
            connect(cluster.nats.url, name="thief", attempts=1, creds=cluster.nats_creds(node_id))
        )
    except ConnectionError as exc:
        return str(exc)
    asyncio.run(nc.close())
    return "connected"


def _wait_for_plan_without(cluster: LocalCluster, node_id: str) -> int:
    deadline = time.monotonic() + REPLAN_TIMEOUT_S
    while time.monotonic() < deadline:
        plan = current_plan(cluster.nats.url, creds=cluster.nats_creds("ops"))
        if plan is not None and node_id not in {s.node_id for s in plan.stages}:
            return plan.version
        time.sleep(0.2)
    raise AssertionError(f"no plan without the revoked {node_id} within {REPLAN_TIMEOUT_S:.0f} s")
