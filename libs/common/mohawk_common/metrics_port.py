"""A process's own Prometheus endpoint on `metrics_port` (env MOHAWK_METRICS_PORT; off when unset),
for shard nodes and coordinators, which have no HTTP API of their own, and for the gateway, whose
API port serves `/metrics` only with a key when API keys are on. The figures come from a function
called at every scrape, so nothing is kept twice. The telemetry service's endpoint is the
cluster's view; these are each process's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class _Collected(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())


def serve_metrics(port: int | None, host: str, collect: Callable[[], Iterable[Metric]]) -> WSGIServer | None:
    """Serve `collect()`'s metrics on http://host:port/metrics from a daemon thread (None: not at
    all). The server is returned so that a process which outlives it can `shutdown()` it."""
    if port is None:
        return None
    registry = CollectorRegistry()
    registry.register(_Collected(collect))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
