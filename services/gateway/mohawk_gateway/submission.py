"""`Submission`: what a route asks the pipeline for, the one record that crosses the gateway.

A route (chat, completions, a session's turn) turns its body into a `Submission`: the prompt's
token ids, the sampling parameters, who the request is for (tenant, priority, latency budget) and
how to route it (the prefix-affinity key, `sticky` for sessions). From there every step reads the
same record: the token budget (token_budget.py), the generation's lifecycle on the bus
(generation.py) and its observers (generation_observers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mohawk_common.tenancy import PRIORITIES as TENANT_PRIORITIES
from mohawk_common.tenancy import Tenant
from mohawk_proto.v1 import bus_pb2, engine_pb2

PRIORITIES = {  # the tenants' priority names (mohawk_common.tenancy.PRIORITIES) as the bus spells them
    "high": bus_pb2.PRIORITY_HIGH,
    "normal": bus_pb2.PRIORITY_NORMAL,
    "low": bus_pb2.PRIORITY_LOW,
}


@dataclass(frozen=True, slots=True)
class Submission:
    """What a route asks the pipeline for."""

    request_id: str
    endpoint: str  # metrics label: chat | completions
    prompt_token_ids: list[int]
    sampling: engine_pb2.SamplingParams
    prompt_param: str  # the body field that holds the prompt, for error messages
    affinity_key: bytes = b""  # what prefix-affinity routing hashes (routing.py)
    tenant: Tenant | None = None  # None: the anonymous tenant (no limits, weight 1)
    priority: str | None = None  # high | normal | low, at most the tenant's; None: the tenant's own
    latency_budget_ms: float = 0.0  # target time per output token at stage 0; 0: none
    sticky: bool = False  # route by prefix affinity whatever the gateway's routing (sessions)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def charged_tokens(self) -> int:
        """What the request may use at most: its prompt and its completion limit."""
        sampling = self.sampling
        return self.num_prompt_tokens + (sampling.max_tokens if sampling.HasField("max_tokens") else 0)

    @property
    def tenant_name(self) -> str:
        """The tenant's name, "" for the anonymous tenant (metrics, reports and spans use it)."""
        return self.tenant.name if self.tenant is not None else ""

    @property
    def tenant_label(self) -> str:
        """The tenant's label (`Tenant.label`), "" for the anonymous tenant: what telemetry reports
        on the bus carry instead of its name."""
        return self.tenant.label if self.tenant is not None else ""

    def describe_tenant(self, request: bus_pb2.GenerateRequest) -> None:
        """Who the request is for, as stage 0's fair-share scheduler reads it."""
        tenant = self.tenant
        if tenant is not None:
            request.tenant = tenant.name
            request.weight = tenant.weight
        request.priority = PRIORITIES[capped_priority(self.priority, tenant)]
        request.latency_budget_ms = self.latency_budget_ms


PRIORITY_RANK: dict[str, int] = {  # low 0 .. high 2, from the tenants' own order (high first)
    name: rank for rank, name in enumerate(reversed(TENANT_PRIORITIES))
}


def tenant_priority(tenant: Tenant | None) -> str:
    """A tenant's priority; the anonymous tenant's is normal."""
    return tenant.priority if tenant is not None else "normal"


def capped_priority(asked: str | None, tenant: Tenant | None) -> str:
    """The priority a request runs at: what it asked for (a session's QoS), never above its
    tenant's (a tenant lowered after the session began included), else the tenant's own."""
    own = tenant_priority(tenant)
    if asked is None or PRIORITY_RANK[asked] > PRIORITY_RANK[own]:
        return own
    return asked
