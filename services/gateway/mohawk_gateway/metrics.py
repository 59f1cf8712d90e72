"""Prometheus metrics of one gateway, in a registry of its own (so several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.security_rejections = Counter(
            "mohawk_security_rejections",
            "messages, handshakes and packages rejected, by reason",
            ["reason"],
            registry=r,
        )
        self.requests = Counter(
            "mohawk_gateway_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.refused_by_wait = Counter(
            "mohawk_gateway_refused_by_predicted_wait",
            "requests refused (429) because their first token was predicted past its objective",
            registry=r,
        )
        self.in_flight = Gauge(
            "mohawk_gateway_requests_in_flight", "generation requests running", ["endpoint"], registry=r
        )
        self.time_to_first_token = Histogram(
            "mohawk_gateway_time_to_first_token_seconds",
            "from request arrival to its first token",
            ["endpoint"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "mohawk_gateway_generation_duration_seconds",
            "from request arrival to its last token",
            ["endpoint"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "mohawk_gateway_prompt_tokens", "prompt tokens submitted", ["endpoint"], registry=r
        )
        self.prompts_tokenized = Counter(
            "mohawk_gateway_prompts_tokenized",
            "prompts tokenized (a request refused for lack of room never is)",
            registry=r,
        )
        self.generated_tokens = Counter(
            "mohawk_gateway_generated_tokens", "tokens delivered to clients", ["endpoint"], registry=r
        )
        self.cancelled = Counter(
            "mohawk_gateway_cancelled_requests", "requests cancelled on the bus", ["reason"], registry=r
        )
        self.duplicate_events = Counter(
            "mohawk_gateway_duplicate_token_events", "token events dropped as already seen", registry=r
        )
        self.replays = Counter(
            "mohawk_gateway_token_replays",
            "token streams re-read from JetStream (gap or silence)",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
