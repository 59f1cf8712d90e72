"""Fixtures of the gateway tests: the app under uvicorn in a thread, the scripted pipeline beside it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.bus.setup import BusLimits
from mohawk_gateway.app import create_app
from mohawk_gateway.config import GatewaySettings
from tests.gateway.scripted import FakeTokenizer, ScriptedPipeline


class ServerThread:
    """uvicorn serving `app` on a free port from a background thread."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, lifespan="on", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def gateway_settings(nats_url: str, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "request_timeout_s": 10.0,
        "token_gap_wait_s": 0.2,
        "token_idle_probe_s": 1.0,
        "max_body_bytes": 64 * 1024,
        "plan_refresh_s": 1.0,
        # these tests drive the HTTP layer against a scripted plaintext pipeline; the secured bus is
        # tested end to end in tests/integration and tests/security
        "insecure": True,
    }
    values.update(overrides)
    return GatewaySettings.model_validate(values)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def is_ready(client: httpx.Client) -> bool:
    return client.get("/ready").status_code == 200


@pytest.fixture
def tokenizer() -> FakeTokenizer:
    return FakeTokenizer()


@pytest.fixture
def start_gateway(tokenizer: FakeTokenizer) -> Iterator[Callable[..., ServerThread]]:
    """Start a gateway on the given NATS URL (settings overrides as keywords); stopped at teardown."""
    servers: list[ServerThread] = []

    def start(nats_url: str, **overrides: Any) -> ServerThread:
        server = ServerThread(create_app(gateway_settings(nats_url, **overrides), tokenizer=tokenizer))
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_pipeline(
    nats_server: NatsServer, tokenizer: FakeTokenizer
) -> Iterator[Callable[..., ScriptedPipeline]]:
    pipelines: list[ScriptedPipeline] = []

    def start(limits: BusLimits | None = None, **kwargs: Any) -> ScriptedPipeline:
        pipeline = ScriptedPipeline(nats_server.url, tokenizer, limits=limits or BusLimits())
        pipelines.append(pipeline.start(**kwargs))
        return pipeline

    yield start
    for pipeline in pipelines:
        pipeline.stop()


@pytest.fixture
def pipeline(start_pipeline: Callable[..., ScriptedPipeline]) -> ScriptedPipeline:
    """A scripted pipeline with an active plan (max_model_len 64)."""
    return start_pipeline()


@pytest.fixture
def gateway(
    nats_server: NatsServer, pipeline: ScriptedPipeline, start_gateway: Callable[..., ServerThread]
) -> ServerThread:
    return start_gateway(nats_server.url)


@pytest.fixture
def client(gateway: ServerThread) -> Iterator[httpx.Client]:
    """An HTTP client of a gateway that is ready (plan active)."""
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        wait_until(lambda: is_ready(client))
        yield client
