"""What one load test runs: how many sessions and chat clients, how many tokens, which tenants.

Design. Sessions and chat clients are dealt to the tenants round robin (the chat clients carry on
where the sessions stopped), so every tenant asks for the same work, give or take one client; what
each gets back is then the scheduler's doing (weighted fair queuing by tenant weight) and its
quota's. A tenant that must never be refused gets quotas computed from its own demand with room to
spare (`with_generous_quota`), so a 429 for it is a bug; the quota tenant's requests a minute are
set below its demand, so it is refused while it bursts. Every tenant is in one priority class by
default: classes are strict, so a tenant of a higher class would take the pipeline whatever the
weights say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mohawk_common.tenancy import Priority

# A generous bound on the tokens a request is charged (prompt + max_tokens): a session's second
# turn carries the system prompt, the first turn and its answer, well under this.
MAX_CHARGED_TOKENS = 1024
QUOTA_HEADROOM = 2  # generous quotas hold this many times the tenant's whole demand


@dataclass(frozen=True)
class TenantSpec:
    """A tenant as the load test creates it; a limit of None is unlimited."""

    name: str
    weight: float
    priority: Priority = "normal"
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True)
class LoadSpec:
    num_sessions: int
    num_chat_clients: int
    turns_per_session: int = 2
    chat_requests_per_client: int = 2
    tokens_per_turn: int = 16
    ramp_s: float = 20.0  # sessions and chat clients start spread evenly over this
    # No byte of an answer for this long: the request is "hung". Past the gateway's own request
    # timeout (900 s, target.py), so a request the gateway gives up on is its 504, not a hang.
    stall_timeout_s: float = 960.0
    max_retry_wait_s: float = 900.0  # a request refused (429) for longer than this in all gives up
    settle_s: float = 5.0  # quiet time before the RSS taken after the run
    bucket_s: float = 1.0  # width of the time buckets of the report and plot
    # a request still without its first token this long after it was sent is queued at stage 0,
    # not in its own prefill (a step or two): its tenant is backlogged (stats.py)
    queued_after_s: float = 2.0
    system_prompt: str = "You are a concise assistant. Answer in one short paragraph."
    tenants: tuple[TenantSpec, ...] = ()
    # the gateway's time-to-first-token objective (admission by predicted wait; None: off): a
    # request refused for it is retried after its Retry-After, and goodput counts the tokens of
    # requests whose first token came within it
    ttft_objective_s: float | None = None

    def tenant_of_session(self, index: int) -> TenantSpec:
        return self.tenants[index % len(self.tenants)]

    def tenant_of_client(self, index: int) -> TenantSpec:
        return self.tenants[(self.num_sessions + index) % len(self.tenants)]

    def num_sessions_of(self, tenant: str) -> int:
        return sum(1 for i in range(self.num_sessions) if self.tenant_of_session(i).name == tenant)

    def num_clients_of(self, tenant: str) -> int:
        return sum(1 for i in range(self.num_chat_clients) if self.tenant_of_client(i).name == tenant)

    def num_requests_of(self, tenant: str) -> int:
        """Generation requests the tenant sends (session turns and chat calls, not retries)."""
        return (
            self.num_sessions_of(tenant) * self.turns_per_session
            + self.num_clients_of(tenant) * self.chat_requests_per_client
        )

    def can_be_refused(self, tenant: TenantSpec) -> bool:
        """Whether a quota of `tenant` is below its demand, so a 429 for it is expected."""
        num_requests = self.num_requests_of(tenant.name)
        num_clients = self.num_sessions_of(tenant.name) + self.num_clients_of(tenant.name)
        return (
            (tenant.rpm is not None and tenant.rpm < num_requests)
            or (tenant.tpm is not None and tenant.tpm < num_requests * MAX_CHARGED_TOKENS)
            or (tenant.max_concurrency is not None and tenant.max_concurrency < num_clients)
        )

    def with_generous_quota(self, tenant: TenantSpec) -> TenantSpec:
        """`tenant` with every limit at QUOTA_HEADROOM times its whole demand: never refused."""
        num_requests = self.num_requests_of(tenant.name)
        num_clients = self.num_sessions_of(tenant.name) + self.num_clients_of(tenant.name)
        return dataclasses.replace(
            tenant,
            rpm=QUOTA_HEADROOM * num_requests + 1,
            tpm=QUOTA_HEADROOM * num_requests * MAX_CHARGED_TOKENS + 1,
            max_concurrency=QUOTA_HEADROOM * num_clients + 1,
        )


FULL = LoadSpec(num_sessions=1000, num_chat_clients=50)
SHORT = LoadSpec(
    num_sessions=100,
    num_chat_clients=10,
    tokens_per_turn=8,
    ramp_s=2.0,
    stall_timeout_s=180.0,  # busy shared cores can hold a step for seconds: hung means minutes
    max_retry_wait_s=60.0,
    settle_s=2.0,
)
# The quota tenant's requests a minute: its bucket holds that many, so it is refused once it has
# sent more within the run (its demand is about 700 requests in the full form, 74 in the short).
FULL_QUOTA_RPM = 240
SHORT_QUOTA_RPM = 50


def standard_spec(
    *,
    short: bool = False,
    num_sessions: int | None = None,
    num_chat_clients: int | None = None,
    tokens_per_turn: int | None = None,
    quota_rpm: int | None = None,
    ttft_objective_s: float | None = None,
) -> LoadSpec:
    """The load: `gold` (weight 3) and `silver` (2) with generous quotas, `bronze` (1)
    with a low rpm quota; the short form (about 100 sessions) or the full one (1,000)."""
    base = SHORT if short else FULL
    spec = dataclasses.replace(
        base,
        num_sessions=base.num_sessions if num_sessions is None else num_sessions,
        num_chat_clients=base.num_chat_clients if num_chat_clients is None else num_chat_clients,
        tokens_per_turn=base.tokens_per_turn if tokens_per_turn is None else tokens_per_turn,
    )
    rpm = quota_rpm if quota_rpm is not None else SHORT_QUOTA_RPM if short else FULL_QUOTA_RPM
    spec = dataclasses.replace(
        spec, tenants=(TenantSpec("gold", 3.0), TenantSpec("silver", 2.0), TenantSpec("bronze", 1.0, rpm=rpm))
    )
    gold, silver, bronze = spec.tenants
    return dataclasses.replace(
        spec,
        tenants=(spec.with_generous_quota(gold), spec.with_generous_quota(silver), bronze),
        ttft_objective_s=ttft_objective_s,
    )
