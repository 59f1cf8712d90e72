"""Settings of a coordinator replica (section `coordinator:` of config/mohawk.yaml, env MOHAWK_*)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from mohawk_common.bus.config import BusSettings, served_model_name
from mohawk_common.settings import ModelFileSettings
from mohawk_coordinator.planner import Placement
from mohawk_coordinator.replicas import Replicas


def default_coordinator_id() -> str:
    """`<hostname>-<pid>`: unique per replica, and readable in `nats kv get mohawk_leader coordinator`."""
    return f"{socket.gethostname()}-{os.getpid()}"


class CoordinatorSettings(BusSettings, ModelFileSettings):
    yaml_section: ClassVar[str] = "coordinator"

    coordinator_id: str = Field(default_factory=default_coordinator_id, min_length=1, max_length=256)
    placement: Placement = Field("spread", description="spread: every node takes layers; pack: fewest hops")
    replicas: Replicas = Field(
        1, description="pipelines to form: a number, or auto (as many as the nodes hold); see replicas.py"
    )
    standbys: bool = Field(
        False,
        description="ask nodes with memory to spare to hold another stage's layers warm (a spare "
        "whole, a neighbour widening its stage), so a failover re-plans onto them with no load "
        "(standbys.py); off: a replacement loads its layers while stage 0 keeps the requests",
    )
    max_model_len: int | None = Field(None, ge=2, description="context cap; none = the model's and KV's")
    plan_settle_s: float = Field(
        1.5, ge=0, description="re-plan once the set of live nodes has been unchanged this long"
    )
    expected_nodes: int | None = Field(
        None,
        ge=1,
        description="make a term's first plan as soon as this many nodes are live, without waiting "
        "plan_settle_s (mohawk up sets it to the nodes it starts); none = always wait",
    )
    events_creds: Path | None = Field(
        None,
        description="the NATS events user (<pki-dir>/nats-auth/creds/events.creds, made with the "
        "cluster's NATS keys): hears nats-server's disconnect advisories, so a node whose connection "
        "closes leaves the plan within departure_grace_s instead of node_ttl_s; none = heartbeats only",
    )
    departure_grace_s: float = Field(
        0.05,
        ge=0,
        description="a node's closed connection counts as its departure unless it reconnects this soon "
        "(to another server of its pool: 2-3 ms on loopback)",
    )
    quarantine_failures: int = Field(
        3, ge=1, description="a node failing this many steps within quarantine_window_s is left out"
    )
    quarantine_window_s: float = Field(60.0, gt=0, description="the window quarantine_failures count in")
    quarantine_s: float = Field(120.0, gt=0, description="how long a quarantined node stays out of plans")
    state_dir: Path | None = Field(
        None,
        description="what this replica keeps across restarts (the highest plan version it has seen "
        "signed); none = .mohawk/state/<coordinator id>",
    )

    @field_validator("replicas")
    @classmethod
    def _at_least_one(cls, value: Replicas) -> Replicas:
        if value != "auto" and value < 1:
            raise ValueError("must be auto or at least 1")
        return value

    @property
    def state_path(self) -> Path:
        """Where `state_dir` points, or its default."""
        default = Path(".mohawk") / "state" / self.coordinator_id
        return self.state_dir if self.state_dir is not None else default

    @property
    def served_model(self) -> str:
        """The model name nodes heartbeat and plans carry."""
        return served_model_name(self.model, self.served_model_name)
