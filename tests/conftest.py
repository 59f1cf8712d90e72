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


@pytest.fixture(scope="session")
def reference() -> dict[str, str]:
    """The single-process engine's greedy texts of the cluster prompts, computed once for every
    module that compares a cluster's answers with them (integration, chaos)."""
    from tests.integration.cluster_helpers import reference_texts

    return reference_texts()
