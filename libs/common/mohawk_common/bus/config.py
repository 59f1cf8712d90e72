"""Settings every service that talks to the bus shares (env MOHAWK_NATS_URL etc. reach them all)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from mohawk_common.bus.setup import (
    BUCKET_MAX_BYTES,
    NODE_TTL_S,
    REQUESTS_MAX_BYTES,
    TOKENS_MAX_BYTES,
    BusLimits,
)
from mohawk_common.settings import KVBlockSettings

BUNDLED_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"  # every process's and tool's default (MOHAWK_NATS_URL)
BUNDLE_CREDS = "nats.creds"  # a node's own NATS user, beside its certificate in its bundle


class BusSettings(KVBlockSettings):
    nats_url: str = Field(DEFAULT_NATS_URL, description="NATS server URL(s), comma-separated")
    nats_creds: Path | None = Field(
        None,
        description="this process's own NATS user (a .creds file: `mohawk pki issue` puts nats.creds in "
        "the node's bundle); none = the bundle's nats.creds if there, else anonymous",
    )
    nats_tls_ca: Path | None = Field(
        None,
        description="the bus CA's certificate (<pki-dir>/nats-tls/ca.pem): NATS over TLS, the server "
        "verified against it; none = what the URL and server ask for",
    )
    nats_replicas: int = Field(1, ge=1, le=5, description="JetStream replicas for streams and buckets")
    max_queued_requests: int = Field(1024, ge=1, description="accepted, unfinished requests; past it: 429")
    requests_max_bytes: int = Field(
        REQUESTS_MAX_BYTES, ge=1 << 20, description="the request stream's bytes; past them: 429"
    )
    tokens_max_bytes: int = Field(
        TOKENS_MAX_BYTES,
        ge=1 << 20,
        description="the token stream's bytes (oldest events dropped past them: keep above what the "
        "cluster emits in 10 minutes, the events a resume reads back)",
    )
    bucket_max_bytes: int = Field(BUCKET_MAX_BYTES, ge=1 << 20, description="each KV bucket's bytes")
    lease_ttl_s: float = Field(3.0, gt=0, description="coordinator leader lease")
    heartbeat_interval_s: float = Field(1.0, gt=0, description="how often shard nodes heartbeat")
    node_ttl_s: float = Field(
        NODE_TTL_S,
        gt=0,
        description="a node silent this long is dead, to every process alike: the coordinator's "
        "registry, the gateways' view of a pipeline, telemetry and the nodes bucket (3 heartbeats)",
    )
    served_model_name: str | None = Field(None, description="model name in the API; none = from the file")
    pki_dir: Path | None = Field(
        None, description="this process's certificate bundle; none = .mohawk/pki/nodes/<its id>"
    )
    dev_pki_dir: Path | None = Field(
        None,
        description="development only: a shared PKI root directory; a process with no bundle issues its own",
    )
    insecure: bool = Field(False, description="run with no certificate and a plaintext bus (development)")
    kem_provider: str = Field("cryptography", description="ML-KEM provider: cryptography, oqs or auto")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="shard nodes and coordinators: serve /metrics on this port; none = off",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="address the metrics port listens on: this host only by default; 0.0.0.0 where a "
        "Prometheus elsewhere scrapes it (compose sets that on its network)",
    )
    telemetry: bool = Field(True, description="publish step and request reports for the telemetry service")

    @model_validator(mode="after")
    def _ttl_spans_a_heartbeat(self) -> BusSettings:
        if self.node_ttl_s < self.heartbeat_interval_s:
            raise ValueError(
                f"node_ttl_s ({self.node_ttl_s}) must be at least heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or nodes flap between live and dead"
            )
        return self

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]

    def bundle_dir(self, process_id: str) -> Path:
        if self.pki_dir is None and self.dev_pki_dir is not None:
            return self.dev_pki_dir / "nodes" / process_id  # where a development bundle is issued
        return self.pki_dir if self.pki_dir is not None else Path(".mohawk") / "pki" / "nodes" / process_id

    def bus_creds(self, process_id: str) -> Path | None:
        """The NATS user `process_id` connects as: `nats_creds`, else its bundle's own (nats.creds),
        else none (anonymous)."""
        if self.nats_creds is not None:
            return self.nats_creds
        in_bundle = self.bundle_dir(process_id) / BUNDLE_CREDS
        return in_bundle if in_bundle.is_file() and not self.insecure else None

    def bus_limits(self) -> BusLimits:
        return BusLimits(
            replicas=self.nats_replicas,
            max_queued_requests=self.max_queued_requests,
            requests_max_bytes=self.requests_max_bytes,
            tokens_max_bytes=self.tokens_max_bytes,
            bucket_max_bytes=self.bucket_max_bytes,
            lease_ttl_s=self.lease_ttl_s,
            node_ttl_s=self.node_ttl_s,
        )


def served_model_name(model_path: str | None, override: str | None = None) -> str:
    """The model's name in the API and in subjects: the override, the bundled name, or the file's stem."""
    if override:
        return override
    if model_path is None:
        return BUNDLED_MODEL_NAME
    from pathlib import Path

    path = Path(model_path)
    return (path.stem if path.is_file() else path.name).lower()
