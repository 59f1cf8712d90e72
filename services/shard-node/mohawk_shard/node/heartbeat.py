"""A shard node's heartbeat, built from its `NodeSnapshot`: what it offers the planner, which plan
and stage it follows, and how its stage is doing.

Design. The heartbeat, the telemetry report and /metrics read one snapshot of the node
(`snapshot.py`), so none of them reaches into the node or its roles. The snapshot brings what
changes (the plan followed, the stage and whether it is loaded, step failures, rejections, the
running stage's hop times and, on stage 0, the requests it holds); the node's measured `Capacity`
and the model's shape bring what the planner sizes stages by. Every heartbeat is signed by the
node before it goes out (`sign_record`), outside this module.
"""

from __future__ import annotations

import time

from mohawk_common.model_store import ModelConfig
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.node.capacity import Capacity
from mohawk_shard.node.snapshot import NodeSnapshot


def build_heartbeat(
    snapshot: NodeSnapshot,
    capacity: Capacity,
    config: ModelConfig,
    *,
    started_at_ms: int,
    held_layers: tuple[int, int] | None = None,
    insecure: bool = False,
) -> bus_pb2.Heartbeat:
    """The heartbeat of the node `snapshot` describes (`held_layers`: the range of its slice package)."""
    following = snapshot.following
    heartbeat = bus_pb2.Heartbeat(
        node_id=snapshot.node_id,
        role="shard",
        model=snapshot.model,
        backend=snapshot.runtime,
        device=snapshot.device,
        total_memory_bytes=capacity.total_memory_bytes,
        free_memory_bytes=capacity.free_memory_bytes(),
        memory_limit_bytes=snapshot.memory_limit_bytes,
        kv_cache_bytes=capacity.kv_cache_bytes,
        kv_block_bytes_per_layer=capacity.kv_block_bytes_per_layer,
        seconds_per_layer=capacity.seconds_per_layer,
        plan_version=following.plan_version,
        stage=following.stage_index,
        loaded=following.loaded,
        standby_layer_start=following.standby[0],
        standby_layer_end=following.standby[1],
        sent_at=time.time(),
        started_at_ms=started_at_ms,
        insecure=insecure,
    )
    capacity.describe(heartbeat, config)
    heartbeat.security_rejections.update(snapshot.rejections)
    if held_layers is not None:
        heartbeat.held_layer_start, heartbeat.held_layer_end = held_layers
    heartbeat.failed_steps, heartbeat.expired_steps = snapshot.failed_steps, snapshot.expired_steps
    stage = snapshot.stage
    if stage is not None:
        if stage.queue is not None:
            heartbeat.held_requests.extend(stage.queue.held_acks)
        heartbeat.hop_ms_p50 = stage.hops.percentile_ms(0.5)
        heartbeat.hop_ms_p99 = stage.hops.percentile_ms(0.99)
        heartbeat.num_hops = stage.hops.num_hops
    return heartbeat
