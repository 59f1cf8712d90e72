"""Fixtures shared by every test package: a real nats-server on a free port, per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mohawk_common.bus.server import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream (file storage under tmp_path); tests may kill/restart it."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log").start()
    try:
        yield server
    finally:
        server.stop()
