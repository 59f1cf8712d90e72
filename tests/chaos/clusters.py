"""The clusters the chaos tests break: real processes, one thread per shard node, fp32 weights (a
re-batched recompute then gives the undisturbed run's text exactly)."""

from __future__ import annotations

from pathlib import Path

from mohawk_cli.cluster import ClusterSpec
from mohawk_common.bus.server import free_port
from tests.integration.cluster_helpers import REFERENCE_WEIGHTS


def chaos_spec(data_dir: Path, nodes: int, **env: str) -> ClusterSpec:
    """`nodes` shard nodes, one coordinator, the gateway, NATS on free ports; `env` on top."""
    return ClusterSpec(
        nodes=nodes,
        coordinators=1,
        port=free_port(),
        nats_port=free_port(),
        data_dir=data_dir,
        threads_per_node=1,
        env={"MOHAWK_WEIGHTS": REFERENCE_WEIGHTS, **env},
        max_payload=256 * 1024,  # a 512-token step's activations cross in chunks
    )
