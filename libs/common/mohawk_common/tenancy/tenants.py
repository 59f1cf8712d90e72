"""A tenant: a name, its limits, how the scheduler weighs it, and which key it holds (by prefix)."""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mohawk_common.tenancy.errors import TenancyError

Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
# The fields an operator sets (`mohawk tenant add|update`); the rest are the store's.
LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "priority", "weight", "ttft_objective_s")


class Tenant(BaseModel):
    """One tenant as stored; a limit of None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits, _ and -; 64 at most")
    rpm: int | None = Field(None, ge=1, description="requests a minute")
    tpm: int | None = Field(None, ge=1, description="tokens a minute (prompt + completion)")
    max_concurrency: int | None = Field(None, ge=1, description="requests running at once")
    priority: Priority = "normal"
    weight: float = Field(1.0, gt=0, description="share of the pipeline against other tenants")
    ttft_objective_s: float | None = Field(
        None,
        gt=0,
        description="time to first token past which its requests are refused (429); none: the gateway's",
    )
    key_prefix: str = Field("", description="the first characters of the current key, for display")
    created: float = Field(default_factory=time.time, description="UNIX time it was added")
    id: str = Field("", description="given once when it is added, never changed ('': stored before ids)")

    @property
    def owner_id(self) -> str:
        """What owns this tenant's sessions: its id, never its name, so a tenant removed and added
        again under the same name owns nothing of the old one's. A tenant stored before ids existed
        is told apart by when it was added (stored with it, so it is as stable as an id)."""
        return self.id or f"{self.name}@{self.created!r}"

    @property
    def label(self) -> str:
        """What names it where its name must not go (telemetry reports on the bus): a digest of its
        `owner_id`, stable for the tenant's life, meaningless to a reader of the bus; `mohawk tenant
        ls` shows it beside the name."""
        return "t-" + hashlib.sha256(self.owner_id.encode()).hexdigest()[:12]

    @property
    def is_limited(self) -> bool:
        """Whether any rate limit applies to it."""
        return self.rpm is not None or self.tpm is not None or self.max_concurrency is not None


def new_tenant_id() -> str:
    return f"ten_{uuid.uuid4().hex}"


def make_tenant(**fields: Any) -> Tenant:
    """A validated Tenant, or TenancyError with one line naming what is wrong."""
    try:
        return Tenant(**fields)
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise TenancyError(f"invalid tenant: {problems}") from None


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "string_pattern_mismatch":
        return f"{where}: {error['input']!r} is not 1 to 64 of a-z, 0-9, _ and -, starting with a-z or 0-9"
    return f"{where}: {error['msg']}"
