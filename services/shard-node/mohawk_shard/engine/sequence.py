"""`Sequence`: the one object that crosses the engine's layers (engine, scheduler, block manager)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from mohawk_common.errors import InvalidRequestError
from mohawk_shard.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Priority(enum.IntEnum):
    """A priority class: a lower value is served strictly first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2


@dataclass(frozen=True, slots=True)
class QoS:
    """Whom a request counts against and how it is served: its tenant, its priority class, its
    weight against the other tenants of that class, and its target time per output token
    (`latency_budget_ms`, 0 = none). The defaults are one anonymous tenant, as before tenants."""

    tenant: str = ""
    priority: Priority = Priority.NORMAL
    weight: float = 1.0
    latency_budget_ms: float = 0.0

    @classmethod
    def create(
        cls,
        tenant: str = "",
        priority: Priority = Priority.NORMAL,
        weight: float = 1.0,
        latency_budget_ms: float = 0.0,
    ) -> QoS:
        """Validated; a weight of 0 means 1.0 (the wire's unset value). Raises InvalidRequestError."""
        if not math.isfinite(weight) or weight < 0:
            raise InvalidRequestError(f"weight must be a positive number, not {weight}")
        if not math.isfinite(latency_budget_ms) or latency_budget_ms < 0:
            raise InvalidRequestError(
                f"latency_budget_ms must be 0 (none) or positive, not {latency_budget_ms}"
            )
        return cls(tenant, Priority(priority), weight or 1.0, latency_budget_ms)


DEFAULT_QOS = QoS()


@dataclass(eq=False)
class Sequence:
    """A request's tokens and its progress through the KV cache.

    `num_computed_tokens` counts tokens whose KV has been scheduled for computation; it runs ahead
    of the pipeline, so a sequence whose every token is computed is waiting for its next sampled
    token and is not scheduled again until that token is appended.
    """

    seq_id: int
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    # one block table per KV group (`mohawk_common.kv_groups`); a model without sliding layers has one
    block_tables: list[list[int]] = field(default_factory=lambda: [[]])
    num_preemptions: int = 0
    qos: QoS = DEFAULT_QOS
    last_served: int = -1  # the scheduler's service count when it last ran (a tenant's take turns)
    # time.monotonic() when it was queued again to continue tokens it had emitted (a resume after a
    # lost step or stage 0, a redelivery); 0.0 for a new request. Resumed ones are served first.
    resumed_at: float = 0.0
    # positions [0, n) whose KV stage 0 holds from its stage before a re-plan (`kv_carry`): they are
    # not computed there again, so they cost a step's token budget nothing
    num_carried_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def block_ids(self) -> list[int]:
        """The first group's block table (the only one of a model without sliding layers)."""
        return self.block_tables[0]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when only the latest sampled token is left to compute."""
        return self.num_uncomputed_tokens == 1 and self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
