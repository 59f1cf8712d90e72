"""Settings of a shard node: the engine's (section `shard:`) plus the bus and the node's identity."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from mohawk_common.bus.config import BusSettings
from mohawk_shard.config import EngineSettings


def _default_node_id() -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    return host or f"node-{os.getpid()}"


class NodeSettings(BusSettings, EngineSettings):
    @property
    def state_path(self) -> Path:
        """Where `state_dir` points, or its default."""
        return self.state_dir if self.state_dir is not None else Path(".mohawk") / "state" / self.node_id

    node_id: str = Field(
        default_factory=_default_node_id,
        description="unique per node; default (or `null`, as docker-compose.dev.yml sets): hostname",
    )

    @field_validator("node_id", mode="before")
    @classmethod
    def _hostname_when_none(cls, value: object) -> object:
        """MOHAWK_NODE_ID=null overrides a compose file's fixed id with the hostname default."""
        return _default_node_id() if value is None else value

    backend: Literal["torch", "mlx"] = Field(
        "torch", description="torch (CPU, CUDA) or mlx (Apple Silicon; a Linux CPU through mlx-cpu)"
    )
    memory_limit_mb: int | None = Field(
        None, ge=1, description="memory offered for weights + KV; none = 80% of the device's"
    )
    host_cores_file: Path | None = Field(
        None,
        description="a file the shard nodes of one host share (`mohawk up` sets one): a node computing "
        "while the others idle takes all of `num_threads`, and its share while they compute too",
    )
    max_inflight_steps: int | None = Field(
        None, ge=1, description="pipeline steps in flight at stage 0; none = one per stage"
    )
    max_waiting: int = Field(
        1024,
        ge=1,
        description="requests stage 0 holds queued once every sequence slot is taken: fair share "
        "by tenant picks among these (a deeper queue is fairer; with replicas, one stage 0 may hold "
        "requests another could start)",
    )
    weights_from: Literal["disk", "bus"] = Field(
        "disk",
        description="disk: the model file; bus: this node's signed, encrypted slice package from the "
        "mohawk_slices object store (no model on this node's disk)",
    )
    model_revision: str | None = Field(
        None,
        description="with weights_from bus: the model revision the slice package must carry "
        "(`mohawk slice pack --revision`); none = one packed no earlier than the newest this node "
        "has loaded (an older signed package is refused as a rollback)",
    )
    state_dir: Path | None = Field(
        None,
        description="what this node keeps across restarts (the newest slice package it has loaded); "
        "none = .mohawk/state/<node id>",
    )
    make_before_break: bool = Field(
        True,
        description="on a plan change, load the new stage beside the running one and switch when the new "
        "pipeline is active (where memory has room for both); false: stop first, then load",
    )
    kv_carry: bool = Field(
        True,
        description="a stage stopped by a re-plan hands its KV of each request to the node's next "
        "stage, so a failover recomputes only the layers whose KV died (torch; MLX computes again)",
    )
    kv_mirror: bool = Field(
        True,
        description="a stage whose layers the next stage's node holds on standby sends that node its "
        "KV each step, so taking the layers over after a failover computes nothing again (torch, "
        "with kv_carry; costs the covered layers' KV of each new token on the wire and in the "
        "holder's host memory)",
    )
    kv_mirror_max_mb: int = Field(
        1024,
        ge=0,
        description="host memory a node keeps for KV mirrored to it (kv_mirror); a request past it is "
        "not kept, and its layers are computed again if the node takes them over",
    )
    request_ack_wait_s: float = Field(
        10.0,
        gt=1,
        description="a request unacked this long is redelivered (stage 0 died): kept alive every third",
    )
    step_deadline_floor_s: float = Field(
        5.0, gt=0, description="a pipeline step is given up after this plus 4x its expected round trip"
    )
    max_resumes: int = Field(
        3,
        ge=0,
        description="a request whose steps are given up this many times in a row, with no token in "
        "between, ends with a 503 error event (0: at the first)",
    )
