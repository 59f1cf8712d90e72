"""Two replicas and a spare: prefix affinity keeps a conversation on the pipeline that caches it;
kill -9 one pipeline's node under greedy streams, and the other pipeline serves on without
reloading, the spare takes the dead node's place, and no request is lost.

Real processes: nats-server, a coordinator asked for 2 replicas with `pack` placement, three shard
nodes (each holds the whole model: two one-stage pipelines and a spare) and the gateway. Both
stage-0 nodes pull from the one shared request consumer and from their own route's; the gateway
routes round robin, so half the streams wait on the victim's route, which the surviving pipeline
drains while the victim's is inactive. The
killed node's requests are handed back to the durable stream by the coordinator as soon as the
node's heartbeats stop (its last heartbeat listed them), and are resumed, from the tokens already
emitted, by whichever pipeline pulls them first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mohawk_cli.cluster import LocalCluster
from mohawk_common.bus.pipelines import pipelines
from mohawk_common.bus.server import free_port
from tests.chaos.clusters import assert_identical, chaos_spec, events, streams_through
from tests.integration.cluster_helpers import current_plan, reference_texts

# about 70 s of two-replica cluster: `make chaos` runs it (`make test` keeps to the cheaper faults)
pytestmark = pytest.mark.slow

NUM_STREAMS = 8
HEARTBEAT_S = 0.2
# the kill comes 1.5 heartbeats after every stream's first text (the leader must hold a heartbeat
# listing the victim's requests): answers long enough to be mid-way then on a fast CPU
LONG_ANSWER_TOKENS = 96
BLOCK_SIZE = 16  # the coordinator's default: the prefix cache keeps whole blocks
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(
        tmp_path_factory.mktemp("chaos-replicas"),
        3,
        MOHAWK_REPLICAS="2",
        MOHAWK_PLACEMENT="pack",
        MOHAWK_ROUTING="round-robin",  # half the streams on the victim's own route
        # the kill comes as the answers begin: a heartbeat listing the victim's requests must have
        # reached the leader by then, for it to hand them back at once
        MOHAWK_HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S),
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        deadline = time.monotonic() + 60
        while not _both_active(running) and time.monotonic() < deadline:
            time.sleep(0.5)
        yield running


def _both_active(cluster: LocalCluster) -> bool:
    plan = current_plan(cluster.nats.url, cluster.nats_creds("ops"))
    return plan is not None and sum(p.active for p in pipelines(plan)) == 2


def _loads(cluster: LocalCluster, node: str) -> int:
    return len(events(cluster, node, "stage loaded"))


def test_prefix_affinity_keeps_a_conversation_on_the_pipeline_with_its_prefix(cluster: LocalCluster) -> None:
    base = cluster.start_gateway("gateway-affinity", free_port(), {"MOHAWK_ROUTING": "prefix-affinity"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _ready(base):
        time.sleep(0.5)
    system = {"role": "system", "content": "You answer in one short sentence."}
    for topic in ("rivers", "owls", "copper", "tea", "glaciers", "chess"):
        history = [system, {"role": "user", "content": f"Tell me one fact about {topic}."}]
        first = _chat(base, history)
        history += [first["choices"][0]["message"], {"role": "user", "content": "And another one?"}]
        second = _chat(base, history)
        # the first turn's prompt, in whole blocks, is in the prefix cache of the pipeline that ran it
        turn_one = first["usage"]["prompt_tokens"] // BLOCK_SIZE * BLOCK_SIZE
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= turn_one > 0, (topic, cached, turn_one)


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _chat(base: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return dict(response.json())


@pytest.fixture(scope="module")
def long_reference() -> dict[str, str]:
    return reference_texts(max_tokens=LONG_ANSWER_TOKENS)


def test_a_spare_replaces_a_killed_replica_and_the_other_serves_on(
    cluster: LocalCluster, long_reference: dict[str, str]
) -> None:
    plan = current_plan(cluster.nats.url, cluster.nats_creds("ops"))
    assert plan is not None
    first, second = pipelines(plan)
    assert len(first.stages) == len(second.stages) == 1 and len(plan.spares) == 1
    survivor, victim, spare = first.node_ids[0], second.node_ids[0], plan.spares[0]
    loads_before = _loads(cluster, survivor)

    done, took = streams_through(
        cluster,
        lambda: cluster.kill(victim),
        NUM_STREAMS,
        settle_s=1.5 * HEARTBEAT_S,
        max_tokens=LONG_ANSWER_TOKENS,
    )
    print(f"\nreplica {victim} killed: all {len(done)} streams done {took:.1f} s later")
    assert_identical(done, long_reference)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        after = current_plan(cluster.nats.url, cluster.nats_creds("ops"))
        assert after is not None
        lines = {p.id: p for p in pipelines(after)}
        if lines[second.id].node_ids == (spare,) and lines[second.id].active:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the spare {spare} did not take pipeline {second.id}'s place: {after}")
    assert lines[first.id].epoch == first.epoch and lines[first.id].node_ids == (survivor,)
    assert _loads(cluster, survivor) == loads_before  # served on through the plan change
    coordinator_log = (cluster.log_dir / "coordinator-1.log").read_text()
    assert "requests of a lost stage 0 handed back" in coordinator_log  # not left to the ack wait
