"""Kill -9 the middle stage under 16 greedy streams with warm standbys on (`standbys`): the
coordinator hears the node's connection close, re-plans onto the neighbour that holds the dead
node's layers already, that neighbour widens its stage with nothing to load, the last stage keeps
its range, and every stream finishes with the text of an undisturbed run.

Real processes: nats-server, a coordinator, three shard nodes and the gateway, `mohawk up`'s
defaults but for the setting under test. The figures it prints (the departure heard, the longest
stall a stream saw) are docs/request-flow.md's; nothing here asserts a time but the bound on the
whole run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import assert_identical, chaos_spec, streams_through
from tests.integration.cluster_helpers import current_plan, wait_for_stages

NUM_STREAMS = 16
BOUND_S = 60.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-standby"), 3, MOHAWK_STANDBYS="true")
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


def events(cluster: LocalCluster, name: str, event: str) -> list[dict[str, Any]]:
    lines = (cluster.log_dir / f"{name}.log").read_text().splitlines()
    parsed = (json.loads(line) for line in lines if line.startswith("{"))
    return [e for e in parsed if e.get("event") == event]


def at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


@pytest.mark.slow
def test_a_killed_stage_is_taken_over_by_the_neighbour_holding_its_layers(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    plan = wait_for_stages(cluster, 3)
    victim = plan.stages[1].node_id
    creds = cluster.nats_creds("ops")
    deadline = time.monotonic() + 120
    while True:  # the standbys load once the pipeline is active: wait for the one covering the victim
        plan = current_plan(cluster.nats.url, creds) or plan
        covering = [b for b in plan.standbys if b.covers == victim]
        if covering and events(cluster, covering[0].node_id, "standby loaded"):
            break
        assert time.monotonic() < deadline, f"no standby held for {victim}'s layers: {plan}"
        time.sleep(0.25)
    holder, first, last = covering[0].node_id, plan.stages[0], plan.stages[2]
    streams_through(cluster, lambda: None, NUM_STREAMS)  # warm-up
    stalls: list[float] = []
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.time())
        cluster.kill(victim)

    done, took = streams_through(cluster, kill, NUM_STREAMS, BOUND_S, stalls=stalls)
    assert_identical(done, reference)

    after = [e for e in events(cluster, "coordinator-1", "plan published") if at(e) > killed_at[0]]
    assert after, "no plan after the kill"
    repaired = after[0]
    own = first if holder == first.node_id else last
    middle = plan.stages[1]
    widened = f"0:{holder}[{min(own.start, middle.start)},{max(own.end, middle.end)})"
    other = last if own is first else first
    assert sorted(repaired["stages"]) == sorted([widened, f"0:{other.node_id}[{other.start},{other.end})"])
    loads = [e for e in events(cluster, holder, "stage loaded") if at(e) > killed_at[0]]
    assert loads and loads[0]["from_standby"] is True, loads
    kept = [e for e in events(cluster, other.node_id, "stage loaded") if at(e) > killed_at[0]]
    assert kept and all(e["kept_weights"] and not e["from_standby"] for e in kept), kept
    print(
        f"\n{victim} (middle stage) killed: a plan onto {holder}'s standby "
        f"{repaired_delay(repaired, killed_at[0]):.3f} s later, {holder} loaded in "
        f"{loads[0]['load_s']:.2f} s (from its standby); all {len(done)} streams done {took:.1f} s "
        f"later, the longest stall {max(stalls):.2f} s"
    )


def repaired_delay(published: dict[str, Any], killed_at: float) -> float:
    return at(published) - killed_at
