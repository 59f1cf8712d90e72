"""Who may read the gateway's metrics: with API keys on, /metrics on the API port needs the
operator's metrics key (MOHAWK_METRICS_KEY), never a tenant's key; the metrics port serves the same
registry with no key, on 127.0.0.1 unless told otherwise (compose: 0.0.0.0 for Prometheus)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import httpx
import pytest

from mohawk_common.bus.server import NatsServer, free_port
from tests.gateway.conftest import ServerThread, is_ready, wait_until
from tests.gateway.scripted import ScriptedPipeline
from tests.gateway.test_tenants import CHAT, add_tenant

METRICS_KEY = "mk-metrics-0123456789"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_with_auth_on_metrics_need_the_metrics_key_and_the_metrics_port_needs_none(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> None:
    port = free_port()
    server = start_gateway(
        nats_server.url, redis_url=redis_url, auth=True, metrics_key=METRICS_KEY, metrics_port=port
    )
    tenant_key = add_tenant(redis_url, "acme")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        assert client.post("/v1/chat/completions", json=CHAT, headers=bearer(tenant_key)).status_code == 200
        for headers in ({}, bearer(tenant_key), bearer("mk-nope"), {"Authorization": METRICS_KEY}):
            refused = client.get("/metrics", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json()["error"]["code"] == "invalid_api_key"
            assert "mohawk_gateway" not in refused.text
        allowed = client.get("/metrics", headers=bearer(METRICS_KEY))
        assert allowed.status_code == 200
        assert (
            'mohawk_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in allowed.text
        )
    # the same registry on the metrics port, with no key (it listens on 127.0.0.1 by default)
    assert 'mohawk_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in scrape(port)


def test_with_auth_on_and_no_metrics_key_the_api_port_never_serves_metrics(
    nats_server: NatsServer,
    pipeline: ScriptedPipeline,
    start_gateway: Callable[..., ServerThread],
    redis_url: str,
) -> None:
    server = start_gateway(nats_server.url, redis_url=redis_url, auth=True)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for headers in ({}, {"Authorization": "Bearer"}, bearer(add_tenant(redis_url, "acme"))):
            assert client.get("/metrics", headers=headers).status_code == 401


def test_with_auth_off_metrics_stay_open_and_the_metrics_port_stops_with_the_app(
    nats_server: NatsServer, pipeline: ScriptedPipeline, start_gateway: Callable[..., ServerThread]
) -> None:
    port = free_port()
    server = start_gateway(nats_server.url, metrics_port=port)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/metrics").status_code == 200
    assert "mohawk_gateway_requests_total" in scrape(port)
    server.stop()
    with pytest.raises(OSError):
        scrape(port)


def test_the_metrics_port_listens_on_loopback_by_default() -> None:
    from mohawk_gateway.config import GatewaySettings

    settings = GatewaySettings.model_validate({"metrics_port": 9402})
    assert (settings.metrics_host, settings.metrics_key) == ("127.0.0.1", None)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
