"""Kill -9 a shard node (stage 0, the middle stage or the last) under 16 greedy streams: every stream
finishes with the text of an undisturbed run.

Real processes: nats-server, a coordinator, three shard nodes and the gateway. When the node dies
its heartbeats stop, the coordinator plans the layers over the two left, and the new stage 0
resumes every request from the tokens the token stream holds; a dead stage 0's requests come
back from the durable stream as soon as the coordinator declares it dead (it naks the requests
the node's last heartbeat listed). The cluster may not hold more memory in all than after the
same load undisturbed (the survivors take over the dead node's layers, so only the sum is fair).
Each case starts a 3-node cluster and re-plans: `make test` kills stage 0 (its requests come back
from the durable stream as well); the full form (`make chaos`) kills each stage in turn.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import assert_identical, started_cluster, streams_through
from tests.chaos.memory import kv_pool_bytes, resident_bytes, settled, total_grown
from tests.integration.cluster_helpers import current_plan, wait_for_stages

NUM_STREAMS = 16
BOUND_S = 60.0  # every stream done within this long after the kill


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory, "chaos-shard", 3) as running:
        yield running


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage",
    [0, pytest.param(1, marks=pytest.mark.full_form), pytest.param(2, marks=pytest.mark.full_form)],
    ids=["stage-0", "middle", "last"],
)
def test_a_killed_shard_node_loses_no_request(
    cluster: LocalCluster, reference: dict[str, str], stage: int
) -> None:
    plan = wait_for_stages(cluster, 3)
    victim = plan.stages[stage].node_id
    streams_through(cluster, lambda: None, NUM_STREAMS)  # warm-up: steady allocations first
    before, pools_before = resident_bytes(cluster), kv_pool_bytes(cluster, plan)
    stalls: list[float] = []
    done, took = streams_through(cluster, lambda: cluster.kill(victim), NUM_STREAMS, BOUND_S, stalls=stalls)
    print(
        f"\n{victim} (stage {stage}) killed: all {len(done)} streams done {took:.1f} s later, "
        f"the longest stall {max(stalls):.2f} s"
    )
    assert_identical(done, reference)
    # the survivors now hold the dead node's layers too: the cluster's sum, less the KV pools the
    # plans give (an uneven 3-stage split gives smaller ones than the even 2-stage one), must not grow
    pools = (pools_before, kv_pool_bytes(cluster, current_plan(cluster.nats.url, cluster.nats_creds("ops"))))
    assert settled(lambda: total_grown(before, resident_bytes(cluster), pools)) is None, (
        f"memory did not come back to its level (KV pools {pools[0] >> 20} then {pools[1] >> 20} MiB)"
    )
