"""Settings of the gateway (section `gateway:` of config/mohawk.yaml, env MOHAWK_*, CLI flags on top)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, SecretStr

from mohawk_common.bus.config import BusSettings, served_model_name
from mohawk_common.bus.security import SEALED_REQUEST_LIFETIME_S
from mohawk_common.settings import ModelFileSettings
from mohawk_gateway.admission import BurstHold
from mohawk_gateway.routing import Routing

MIB = 1024 * 1024


class GatewaySettings(BusSettings, ModelFileSettings):
    yaml_section: ClassVar[str] = "gateway"

    gateway_id: str = Field("gateway", description="this gateway's id: its certificate names it")
    host: str = Field("127.0.0.1", description="address the HTTP server listens on")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0 = any free port)")
    log_level: str = Field("info", description="debug, info, warning, error, critical")
    request_timeout_s: float = Field(
        SEALED_REQUEST_LIFETIME_S,  # shard nodes keep a rotated sealing key this long
        gt=0,
        description="longest a request may run, end to end (past the default, a request sealed "
        "before a sealing-key rotation cannot be reopened after a failover)",
    )
    publish_timeout_s: float = Field(5.0, gt=0, description="wait for JetStream to accept a request")
    max_body_bytes: int = Field(4 * MIB, ge=1024, description="largest request body; past it: 413")
    max_in_flight: int = Field(1024, ge=1, description="requests this gateway runs at once; past it: 429")
    queue_wait_s: float = Field(
        30.0,
        gt=0,
        description="a request arriving mid plan change waits (durable) this long for a pipeline, then 503",
    )
    tokenize_threads: int = Field(
        4, ge=1, description="prompts tokenized at once, in threads (HF tokenizers release the GIL)"
    )
    routing: Routing = Field(
        "least-queue",
        description="least-queue: first pipeline with room; round-robin; prefix-affinity: a conversation "
        "stays on one pipeline (routing.py)",
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After of 429 and 503 answers")
    ttft_objective_s: float | None = Field(
        None,
        gt=0,
        description="admission by predicted wait: a request whose first token is predicted later than "
        "this gets 429 with a Retry-After from the same prediction, before it is tokenized; a "
        "tenant's own ttft_objective_s overrides it; none = every request is queued",
    )
    admission_first_look_s: float = Field(
        0.005,
        ge=0,
        description="while a burst is refused, an admitted request first waits this long (the first "
        "requests of a burst arrive before its refusals); 0 with admission_max_hold_s 0: no wait",
    )
    admission_quiet_s: float = Field(
        0.02, ge=0, description="refusals this far apart end a burst: held requests go in"
    )
    admission_max_hold_s: float = Field(
        0.5,
        ge=0,
        description="the longest an admitted request is held while a burst is refused (so the 429s "
        "do not queue behind its JSON, template and tokenizer work); 0: never held. Measured with "
        "`bench/admission.py` (1,200 clients at once, room for 64), two runs each: the 429s' p99 "
        "241-293 ms held, 459-461 ms not; the 64 admitted answered 2-8% later",
    )
    plan_refresh_s: float = Field(5.0, gt=0, description="re-read the plan this often besides watching it")
    token_gap_wait_s: float = Field(0.5, gt=0, description="a missing token index this old is replayed")
    token_idle_probe_s: float = Field(5.0, gt=0, description="no token event this long: replay the stream")
    drain_timeout_s: float = Field(30.0, ge=0, description="on SIGTERM, wait this long for open requests")
    keep_alive_s: float = Field(
        75.0,
        gt=0,
        description="an idle keep-alive connection is closed after this; longer than clients keep "
        "theirs (httpx and the OpenAI SDK: 5 s), so a client never sends on a connection the "
        "gateway is closing (uvicorn's own default is those same 5 s)",
    )
    redis_url: str | None = Field(
        None, description="Redis of tenants, rate limits and sessions (redis://host:port/db); none = off"
    )
    redis_password_file: Path | None = Field(
        None,
        description="a file holding the Redis password (`mohawk up` makes one, compose passes it as "
        "a secret); none = the URL's own, if any",
    )
    redis_tls_ca: Path | None = Field(
        None,
        description="with a rediss:// redis_url: the CA its certificate must chain to (compose: the "
        "bus CA in the gateway's bundle); none = the system's",
    )
    auth: bool = Field(
        False, description="every /v1 call needs `Authorization: Bearer KEY` of a tenant (needs redis_url)"
    )
    metrics_key: SecretStr | None = Field(
        None,
        description="with auth on, /metrics on the API port needs `Authorization: Bearer` this key "
        "(never a tenant's); unset, it answers 401 there. metrics_port serves it with no key, on "
        "127.0.0.1 unless metrics_host says otherwise",
    )
    token_estimate: int = Field(
        256,
        ge=1,
        description="completion tokens charged to a tenant's tokens-a-minute up front when a request "
        "sets no max_tokens (the unused part is given back when it ends)",
    )
    session_ttl_s: float = Field(3600.0, gt=0, description="an idle session is forgotten after this long")

    @property
    def burst_hold(self) -> BurstHold:
        """The admission middleware's hold while a burst is refused (`admission.BurstHold`)."""
        return BurstHold(self.admission_first_look_s, self.admission_quiet_s, self.admission_max_hold_s)

    @property
    def served_model(self) -> str:
        """The model's name in the API and in subjects."""
        return served_model_name(self.model, self.served_model_name)
