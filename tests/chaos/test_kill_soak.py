"""A soak, not a single kill: a random stage of a 3-node pipeline is killed -9 under 16 greedy
streams, the cluster recovers, the node is started again and the pipeline re-forms over three
nodes; `KILLS` times in a row (`make chaos`; `MOHAWK_SOAK_KILLS` changes the count). Every stream
of every round ends with the undisturbed run's text, none is lost, and each recovery's time (the
kill to the last stream's end) and longest stall (the longest wait a stream saw between two
chunks) are printed, with their median and maximum at the end.

The victim is drawn with a seeded generator (`MOHAWK_SOAK_SEED`, printed), so a failing round can
be replayed. Each round waits for the pipeline to be whole again before the next kill: the soak
measures recovery after recovery, not a cluster worn down to one node.
"""

from __future__ import annotations

import functools
import os
import random
import statistics
import time
from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import assert_identical, started_cluster, streams_through
from tests.integration.cluster_helpers import wait_for_stages

KILLS = int(os.environ.get("MOHAWK_SOAK_KILLS", "20"))
SEED = int(os.environ.get("MOHAWK_SOAK_SEED", "20261130"))
NUM_STREAMS = 16
BOUND_S = 60.0  # every stream done within this long after a kill
REFORM_S = 180.0  # the restarted node back in a 3-stage plan within this long


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory, "chaos-soak", 3) as running:
        yield running


@pytest.mark.slow
@pytest.mark.full_form
def test_twenty_kills_in_a_row_lose_nothing(cluster: LocalCluster, reference: dict[str, str]) -> None:
    draw = random.Random(SEED)
    recoveries: list[float] = []
    stalls: list[float] = []
    print(f"\nsoak: {KILLS} kills, seed {SEED}")
    for round_ in range(1, KILLS + 1):
        plan = wait_for_stages(cluster, 3, timeout=REFORM_S)
        stage = draw.randrange(3)
        victim = plan.stages[stage].node_id
        seen: list[float] = []
        kill = functools.partial(cluster.kill, victim)
        done, took = streams_through(cluster, kill, NUM_STREAMS, BOUND_S, stalls=seen)
        assert_identical(done, reference)
        recoveries.append(took)
        stalls.append(max(seen))
        print(f"round {round_}: {victim} (stage {stage}) killed: done {took:.2f} s later, ", end="")
        print(f"longest stall {max(seen):.2f} s")
        cluster.respawn(victim)
        restarted = time.monotonic()
        wait_for_stages(cluster, 3, timeout=REFORM_S)
        print(f"  {victim} back in a 3-stage plan {time.monotonic() - restarted:.1f} s after its restart")
    print(
        f"soak: {KILLS}/{KILLS} recovered, 0 lost; recovery p50 {statistics.median(recoveries):.2f} s, "
        f"max {max(recoveries):.2f} s; longest stall p50 {statistics.median(stalls):.2f} s, "
        f"max {max(stalls):.2f} s"
    )
    assert len(recoveries) == KILLS
