"""Kill -9 the leader coordinator under 16 greedy streams: the standby takes the lease, no request
notices.

Real processes: nats-server, two coordinators, two shard nodes and the gateway. Requests never
pass through a coordinator, so the streams must all finish with an undisturbed run's text; the
standby must hold the lease within a few lease TTLs and adopt the stored plan as it is (no
reload: the nodes' plan version stays), and no process may keep more memory than after the same
load undisturbed. Full form only (`make chaos`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import assert_identical, chaos_spec, streams_through
from tests.chaos.memory import grown, resident_bytes, settled
from tests.integration.cluster_helpers import current_leader, current_plan

NUM_STREAMS = 16
TAKEOVER_S = 15.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-leader"), 2, coordinators=2)
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


@pytest.mark.slow
def test_a_killed_leader_coordinator_loses_no_request(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    streams_through(cluster, lambda: None, NUM_STREAMS)  # warm-up: steady allocations first
    before = resident_bytes(cluster)
    ops = cluster.nats_creds("ops")
    leader = current_leader(cluster.nats.url, ops)
    plan = current_plan(cluster.nats.url, ops)
    assert leader is not None and plan is not None
    done, took = streams_through(cluster, lambda: cluster.kill(leader), NUM_STREAMS)
    assert_identical(done, reference)
    deadline = time.monotonic() + TAKEOVER_S
    while (successor := current_leader(cluster.nats.url, ops)) in (None, leader):
        assert time.monotonic() < deadline, f"no coordinator took over within {TAKEOVER_S} s"
        time.sleep(0.2)
    print(f"\nleader {leader} killed: all {len(done)} streams done {took:.1f} s later; {successor} leads")
    assert successor not in (None, leader)
    after = current_plan(cluster.nats.url, cluster.nats_creds("ops"))
    assert after is not None and after.version == plan.version  # adopted, not re-planned
    del before[leader]
    assert not settled(lambda: grown(before, resident_bytes(cluster))), (
        "memory did not come back to its level"
    )
