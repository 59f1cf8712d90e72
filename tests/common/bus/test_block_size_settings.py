"""One source for the KV block size: the coordinator plans with the same `block_size` field that a
shard node measures its KV bytes per block with (for its heartbeat) and the in-process engine
sizes its cache by, so one MOHAWK_BLOCK_SIZE reaches them all; the plan carries the coordinator's
value to every stage, which sizes its KV cache from the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from mohawk_common.bus.config import BusSettings
from mohawk_common.bus.pipelines import node_view
from mohawk_common.settings import KVBlockSettings, load_settings
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.plan_inputs import build_plan
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.config import EngineSettings
from mohawk_shard.node.config import NodeSettings
from tests.coordinator.harness import SHAPE

PROCESSES = (CoordinatorSettings, NodeSettings, EngineSettings)


@pytest.fixture(autouse=True)
def no_settings_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("")
    monkeypatch.setenv("MOHAWK_CONFIG", str(tmp_path / "empty.yaml"))


def test_every_process_has_the_one_block_size_field() -> None:
    shared = KVBlockSettings.model_fields["block_size"]
    for settings in (BusSettings, *PROCESSES):
        field = settings.model_fields["block_size"]
        assert (field.default, field.description, field.metadata) == (
            shared.default,
            shared.description,
            shared.metadata,
        ), settings.__name__


def test_every_process_reads_the_same_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {load_settings(settings).block_size for settings in PROCESSES} == {16}
    monkeypatch.setenv("MOHAWK_BLOCK_SIZE", "32")
    assert {load_settings(settings).block_size for settings in PROCESSES} == {32}


def test_the_plan_carries_the_coordinators_block_size_to_each_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOHAWK_BLOCK_SIZE", "32")
    beats = [
        bus_pb2.Heartbeat(
            node_id=node_id,
            model="smollm2-135m-instruct",
            backend="torch",
            device="cpu",
            memory_limit_bytes=2 << 30,
            kv_cache_bytes=256 << 20,
            seconds_per_layer=1e-3,
            kv_block_bytes_per_layer=32 * SHAPE.kv_bytes_per_token_per_layer,
        )
        for node_id in ("a", "b")
    ]
    plan = build_plan(SHAPE, beats, load_settings(CoordinatorSettings))
    assert plan.block_size == load_settings(NodeSettings).block_size == 32
    for node_id in ("a", "b"):
        found = node_view(plan, node_id)
        assert found is not None
        assert found[0].block_size == 32
