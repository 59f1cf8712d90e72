"""One source for the liveness settings: the coordinator, shard nodes, gateways and the nodes bucket
read the heartbeat interval and the node TTL from the same bus settings, so they agree on when a
node is dead, and a TTL shorter than a heartbeat is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_common.bus.config import BusSettings
from mohawk_common.bus.setup import NODE_TTL_S
from mohawk_common.errors import ConfigError
from mohawk_common.settings import load_settings
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_gateway.config import GatewaySettings
from mohawk_shard.node.config import NodeSettings

PROCESSES = (CoordinatorSettings, NodeSettings, GatewaySettings)


@pytest.fixture(autouse=True)
def no_settings_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    monkeypatch.setenv("MOHAWK_CONFIG", str(tmp_path / "empty.yaml"))


def test_every_process_reads_the_same_liveness_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for settings in PROCESSES:
        loaded = load_settings(settings)
        assert (loaded.heartbeat_interval_s, loaded.node_ttl_s) == (1.0, NODE_TTL_S)
        assert loaded.bus_limits().node_ttl_s == NODE_TTL_S  # the nodes bucket's TTL too
    monkeypatch.setenv("MOHAWK_HEARTBEAT_INTERVAL_S", "0.2")
    monkeypatch.setenv("MOHAWK_NODE_TTL_S", "0.6")
    for settings in PROCESSES:
        loaded = load_settings(settings)
        assert (loaded.heartbeat_interval_s, loaded.node_ttl_s) == (0.2, 0.6)
        assert loaded.bus_limits().node_ttl_s == 0.6


def test_a_ttl_shorter_than_a_heartbeat_is_refused() -> None:
    for settings in (BusSettings, *PROCESSES):
        with pytest.raises(ConfigError, match="node_ttl_s"):
            load_settings(settings, {"heartbeat_interval_s": 2.0, "node_ttl_s": 1.0})
