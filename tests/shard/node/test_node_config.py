"""NodeSettings' node id: the hostname by default, and again when the environment says `null`
(docker-compose.dev.yml resets the production file's fixed id that way, so shard nodes scale)."""

from __future__ import annotations

import socket

import pytest

from mohawk_common.settings import load_settings
from mohawk_shard.node.config import NodeSettings


def test_the_node_id_is_the_hostname_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "shard.example")
    monkeypatch.delenv("MOHAWK_NODE_ID", raising=False)
    assert load_settings(NodeSettings).node_id == "shard-example"
    monkeypatch.setenv("MOHAWK_NODE_ID", "host1-shard-node")
    assert load_settings(NodeSettings).node_id == "host1-shard-node"
    monkeypatch.setenv("MOHAWK_NODE_ID", "null")
    assert load_settings(NodeSettings).node_id == "shard-example"
