"""A process's own Prometheus endpoint on `metrics_port` (env MOHAWK_METRICS_PORT; off when unset),
for services without an HTTP API of their own (shard nodes, coordinators). The figures come from a
function called at every scrape, so nothing is kept twice; the gateway serves `/metrics` on its API
port instead. The telemetry service's endpoint is the cluster's view; these are each process's."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class _Collected(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())


def serve_metrics(port: int | None, host: str, collect: Callable[[], Iterable[Metric]]) -> None:
    """Serve `collect()`'s metrics on http://host:port/metrics from a daemon thread (None: not at all)."""
    if port is None:
        return
    registry = CollectorRegistry()
    registry.register(_Collected(collect))
    start_http_server(port, addr=host, registry=registry)
