"""`serve_metrics`: a process's own /metrics on MOHAWK_METRICS_PORT, read at every scrape."""

from __future__ import annotations

import httpx
from prometheus_client.core import GaugeMetricFamily

from mohawk_common.bus.server import free_port
from mohawk_common.metrics_port import serve_metrics


def test_each_scrape_reads_the_process_anew_and_no_port_serves_nothing() -> None:
    calls = {"n": 0}

    def collect():  # type: ignore[no-untyped-def]
        calls["n"] += 1
        family = GaugeMetricFamily("mohawk_probe_scrapes", "scrapes so far", labels=["node"])
        family.add_metric(["shard-1"], calls["n"])
        yield family

    serve_metrics(None, "127.0.0.1", collect)  # off: nothing listens, nothing is called
    assert calls["n"] == 0
    port = free_port()
    serve_metrics(port, "127.0.0.1", collect)
    first = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    second = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'mohawk_probe_scrapes{node="shard-1"} 1.0' in first
    assert 'mohawk_probe_scrapes{node="shard-1"} 2.0' in second


def test_the_metrics_port_listens_on_loopback_unless_told_otherwise() -> None:
    """Shard nodes' and coordinators' /metrics are not for the world: 127.0.0.1 by default,
    MOHAWK_METRICS_HOST=0.0.0.0 where a Prometheus on another host or container scrapes them."""
    from mohawk_common.bus.config import BusSettings

    assert BusSettings.model_validate({}).metrics_host == "127.0.0.1"
    assert BusSettings.model_validate({"metrics_host": "0.0.0.0"}).metrics_host == "0.0.0.0"
