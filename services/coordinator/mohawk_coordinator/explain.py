"""`mohawk plan [--explain]`: the current placement plan, as JSON or as a table with its reasons.

Reads only: the plan from the `mohawk_plan` bucket and the live nodes the leader mirrors into
`mohawk_nodes`; it creates nothing on the bus. A stage's weight bytes are its node's own report
(layers × bytes per layer, plus embedding on stage 0 and head on the last), in the format that
node loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect_or_give_up
from mohawk_common.bus.control import decode_json, encode_json, read_plan
from mohawk_common.bus.pipelines import Pipeline, pipelines
from mohawk_common.errors import ConfigError
from mohawk_common.logging import LEVELS, configure_logging
from mohawk_common.settings import load_settings
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.standbys import holds_warm
from mohawk_proto.v1 import bus_pb2

CONNECT_DEADLINE_S = 4.0  # nats-py retries an unreachable server forever; give up after this
NO_PLAN = "no plan has been published yet (is a coordinator running, and are shard nodes heartbeating?)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--explain", action="store_true", help="a table of stages and the plan's reasons")
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated")
    parser.add_argument("--log-level", default="error", choices=LEVELS, help="default: error")


def run(args: argparse.Namespace) -> int:
    """Print the plan; 1 when NATS is unreachable or no plan exists, 2 on bad settings."""
    try:
        settings = load_settings(CoordinatorSettings, {"nats_url": args.nats_url})
        configure_logging(args.log_level)
    except ConfigError as exc:
        print(f"mohawk plan: error: {exc}", file=sys.stderr)
        return 2
    try:
        plan, nodes = asyncio.run(fetch(settings.nats_servers))
    except ConnectionError as exc:
        print(f"mohawk plan: error: {exc}", file=sys.stderr)
        return 1
    if plan is None:
        print(f"mohawk plan: {NO_PLAN}", file=sys.stderr)
        return 1
    if args.explain:
        print(render(plan, nodes))
    else:
        print(json.dumps(json.loads(encode_json(plan)), indent=2))
    return 0


async def fetch(servers: list[str]) -> tuple[bus_pb2.Plan | None, dict[str, bus_pb2.Heartbeat]]:
    """The current plan and the mirrored live nodes; ConnectionError when NATS cannot be reached."""
    nc = await connect_or_give_up(servers, name="mohawk-plan", deadline_s=CONNECT_DEADLINE_S)
    try:
        js = nc.jetstream()
        return await _read_plan(js), await _read_nodes(js)
    finally:
        await nc.close()


async def _read_plan(js: JetStreamContext) -> bus_pb2.Plan | None:
    try:
        kv = await js.key_value(names.PLAN_BUCKET)
    except NotFoundError:
        return None
    return await read_plan(kv)


async def _read_nodes(js: JetStreamContext) -> dict[str, bus_pb2.Heartbeat]:
    try:
        kv = await js.key_value(names.NODES_BUCKET)
        keys = await kv.keys()
    except (NotFoundError, NoKeysError):
        return {}
    nodes = {}
    for key in sorted(keys):
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # expired between listing and reading
            continue
        if entry.value:
            nodes[key] = decode_json(bus_pb2.Heartbeat, entry.value)
    return nodes


def render(plan: bus_pb2.Plan, nodes: Mapping[str, bus_pb2.Heartbeat]) -> str:
    """The plan as operators read it: header, each pipeline with a row per stage, standbys, spares,
    live nodes left out, reasons."""
    created = datetime.fromtimestamp(plan.created, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = pipelines(plan)
    rows = [
        f"plan version {plan.version} ({plan.state}) for {plan.model} [{plan.model_id}], "
        f"written by leader {plan.leader} at {created}",
        f"{plan.num_layers} layers in {len(lines)} pipeline(s) of {len(plan.stages)} stage(s) in all; "
        f"KV blocks of {plan.block_size} tokens; max_model_len {plan.max_model_len}",
    ]
    for pipeline in lines:
        state = "active" if pipeline.active else "loading"
        rows += [
            "",
            f"pipeline {pipeline.id} ({state}, formed by plan version {pipeline.epoch}): "
            f"{pipeline.num_kv_blocks} KV blocks, max_model_len {pipeline.max_model_len}",
        ]
        rows += _stage_rows(pipeline, plan, nodes)
    rows += _standby_rows(plan, nodes)
    quarantined = set(plan.quarantined)
    if plan.spares:
        rows.append(f"spares (ready to replace a failed stage): {', '.join(plan.spares)}")
    idle = sorted(set(nodes) - {s.node_id for s in plan.stages} - quarantined - set(plan.spares))
    if idle:
        rows.append(f"live nodes without a stage: {', '.join(idle)}")
    for node_id in sorted(quarantined):
        failed = nodes[node_id].failed_steps if node_id in nodes else "?"
        rows.append(f"quarantined (steps kept failing; {failed} failed so far): {node_id}")
    rows += ["", "reasons:", *(f"- {reason}" for reason in plan.reasons)]
    return "\n".join(rows)


def _stage_rows(pipeline: Pipeline, plan: bus_pb2.Plan, nodes: Mapping[str, bus_pb2.Heartbeat]) -> list[str]:
    lines = [
        f"{'stage':>5}  {'node':<20} {'layers':<10} {'backend':<8} {'device':<8} "
        f"{'memory MiB':>10} {'KV MiB':>8} {'weights MiB':>11} {'format':<8} {'s/layer':>9}  loaded",
    ]
    for index, stage in enumerate(pipeline.stages):
        layers = f"[{stage.start}, {stage.end})"
        node = nodes.get(stage.node_id)
        if node is None:
            lines.append(f"{index:>5}  {stage.node_id:<20} {layers:<10} (no heartbeat: node not live)")
            continue
        loaded = "yes" if node.loaded and node.plan_version == plan.version else f"no (v{node.plan_version})"
        lines.append(
            f"{index:>5}  {stage.node_id:<20} {layers:<10} {node.backend:<8} {node.device:<8} "
            f"{node.memory_limit_bytes / 2**20:>10.1f} {node.kv_cache_bytes / 2**20:>8.1f} "
            f"{weights_cell(node, stage, plan.num_layers):>11} {node.weights_format or '?':<8} "
            f"{node.seconds_per_layer:>9.2g}  {loaded}"
        )
    return lines


def _standby_rows(plan: bus_pb2.Plan, nodes: Mapping[str, bus_pb2.Heartbeat]) -> list[str]:
    """A row per standby: who holds whose layers warm, whether the covered stage mirrors its KV
    there (the holder runs the stage after it), and whether the holder reports the layers loaded."""
    if not plan.standbys:
        return []
    rows = [
        "",
        f"standbys (layers held warm; a failover takes them over unloaded, its KV mirrored or "
        f"computed again): {len(plan.standbys)}",
    ]
    rows.append(
        f"{'node':<20} {'layers':<10} {'covers':<20} {'pipeline':>8} {'weights MiB':>11} {'kv':<8}  loaded"
    )
    after = {(s.pipeline, s.start): s.node_id for s in plan.stages}
    for standby in plan.standbys:
        node = nodes.get(standby.node_id)
        stage = bus_pb2.PlanStage(start=standby.start, end=standby.end)
        weights = weights_cell(node, stage, plan.num_layers) if node is not None else "?"
        kv = "mirrored" if after.get((standby.pipeline, standby.end)) == standby.node_id else "computed"
        rows.append(
            f"{standby.node_id:<20} {f'[{standby.start}, {standby.end})':<10} {standby.covers:<20} "
            f"{standby.pipeline:>8} {weights:>11} {kv:<8}  {'yes' if holds_warm(standby, nodes) else 'no'}"
        )
    return rows


def stage_weight_bytes(node: bus_pb2.Heartbeat, stage: bus_pb2.PlanStage, num_layers: int) -> int:
    """What `stage` costs `node` in weights, by the bytes it reports (0 when it reports none)."""
    embedding = node.embedding_weight_bytes if stage.start == 0 else 0
    head = node.head_weight_bytes if stage.end == num_layers else 0
    return (stage.end - stage.start) * node.layer_weight_bytes + embedding + head


def weights_cell(node: bus_pb2.Heartbeat, stage: bus_pb2.PlanStage, num_layers: int) -> str:
    if node.layer_weight_bytes <= 0:
        return "?"
    return f"{stage_weight_bytes(node, stage, num_layers) / 2**20:.1f}"
