"""Kill -9 the middle stage under 16 greedy streams with warm standbys on (`standbys`): the
coordinator hears the node's connection close, re-plans onto the neighbour that holds the dead
node's layers already, that neighbour widens its stage with nothing to load, the other stage keeps
its range and weights, and every stream finishes with the text of an undisturbed run.

Real processes: nats-server, a coordinator, three shard nodes and the gateway, `mohawk up`'s
defaults but for the setting under test. The figures it prints (the plan after the kill, the
longest stall a stream saw) are docs/request-flow.md's; nothing here asserts a time but the bound
on the whole run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import (
    TimedKill,
    assert_identical,
    events,
    logged_at,
    standby_held_for,
    started_cluster,
    streams_through,
)
from tests.integration.cluster_helpers import wait_for_stages

NUM_STREAMS = 16
BOUND_S = 60.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory, "chaos-standby", 3, MOHAWK_STANDBYS="true") as running:
        yield running


@pytest.mark.slow
def test_a_killed_stage_is_taken_over_by_the_neighbour_holding_its_layers(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    victim = wait_for_stages(cluster, 3).stages[1].node_id
    plan, holder = standby_held_for(cluster, victim, timeout=120)
    first, middle, last = plan.stages
    streams_through(cluster, lambda: None, NUM_STREAMS)  # warm-up
    stalls: list[float] = []
    across: list[float] = []
    waits: list[float] = []
    kill = TimedKill(cluster, victim)
    done, took = streams_through(
        cluster, kill, NUM_STREAMS, BOUND_S, stalls=stalls, across=across, after=waits
    )
    assert_identical(done, reference)

    after = [e for e in events(cluster, "coordinator-1", "plan published") if logged_at(e) > kill.at]
    assert after, "no plan after the kill"
    own, other = (first, last) if holder == first.node_id else (last, first)
    widened = f"0:{holder}[{min(own.start, middle.start)},{max(own.end, middle.end)})"
    assert sorted(after[0]["stages"]) == sorted([widened, f"0:{other.node_id}[{other.start},{other.end})"])
    loads = [e for e in events(cluster, holder, "stage loaded") if logged_at(e) > kill.at]
    assert loads and loads[0]["from_standby"] is True, loads
    kept = [e for e in events(cluster, other.node_id, "stage loaded") if logged_at(e) > kill.at]
    assert kept and all(e["kept_weights"] and not e["from_standby"] for e in kept), kept
    for survivor in (holder, other.node_id):  # each handed its KV of the streams to its next stage
        carried = events(cluster, survivor, "kv kept for the next stage")
        carried = [e for e in carried if logged_at(e) > kill.at]
        assert carried and carried[0]["requests"] > 0, (survivor, carried)
    # the holder runs the stage after the victim's, which mirrored its KV there: the holder handed
    # on the dead layers' KV of the streams too, so taking them over computed none of it again
    assert holder == last.node_id
    assert events(cluster, victim, "kv mirrored to the next stage's standby")
    carried = [e for e in events(cluster, holder, "kv kept for the next stage") if logged_at(e) > kill.at]
    assert carried[0]["mirrored"] > 0, carried
    print(
        f"\n{victim} (middle stage) killed: a plan onto {holder}'s standby "
        f"{logged_at(after[0]) - kill.at:.3f} s later, {holder} loaded in {loads[0]['load_s']:.2f} s "
        f"(from its standby); all {len(done)} streams done {took:.1f} s later, the longest stall "
        f"{max(stalls):.2f} s, the longest across the kill {max(across):.2f} s, the longest from the kill "
        f"to a stream's next text {max(waits):.2f} s"
    )
