"""A Mixtral GGUF's experts held natively: each expert's matmuls built from its own rows of the
file's 3-D tensors in the file's codes (Q4_K gate as `Int4Linear`, Q8_0 up and Q6_K down as
`GroupwiseLinear`), no expert ever dequantized, the held bytes close to the file's and what the
node's heartbeat and `mohawk model inspect` count."""

from __future__ import annotations

from typing import Any

import pytest

from mohawk_cli.model_report import MOE_PART, layer_weight_bytes, torch_report
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.gguf_source import GGUFSource
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.groupwise_linear import ConcatLinear, GroupwiseLinear
from mohawk_shard.model.linear import Linear
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.quantized_layers import Int4Linear
from mohawk_shard.node.capacity import measure_capacity
from tests.shard.engine.test_gguf_architectures import write_tiny_gguf


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return write_tiny_gguf("mixtral", tmp_path_factory.mktemp("mixtral-native"), native=True)[0]


def _stage(source: ModelSource, start: int, end: int) -> TorchBackend:
    backend = make_backend("torch", source, start, end, device="cpu", weights="native")
    assert isinstance(backend, TorchBackend)
    return backend


def _held(module: Any) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.buffers(), *module.parameters()])


def test_experts_are_held_in_the_files_codes(mixtral: ModelSource, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    dequantize = GGUFSource._read_tensor

    def recording(self: GGUFSource, name: str) -> Any:
        read.append(name)
        return dequantize(self, name)

    monkeypatch.setattr(GGUFSource, "_read_tensor", recording)
    stage = _stage(mixtral, 0, mixtral.config.num_layers)
    assert not [name for name in read if ".mlp.experts." in name]  # no expert dequantized
    assert not stage.formats.fallbacks
    for layer in stage.model.layers:
        moe = layer.mlp
        assert isinstance(moe, SparseMoE) and len(moe.experts) == mixtral.config.num_experts
        for expert in moe.experts:
            gate_up, down = expert.gate_up_proj, expert.down_proj
            assert isinstance(gate_up, ConcatLinear)  # Q4_K gate, Q8_0 up: each in its own codes
            assert [type(p) for p in gate_up.parts] == [Int4Linear, GroupwiseLinear]
            assert isinstance(down, GroupwiseLinear) and down.source_format == "Q6_K"
    dense = [name for name, m in stage.model.named_modules() if isinstance(m, Linear)]
    assert all(name.endswith(".mlp.gate") for name in dense), dense  # the routers only


def test_held_bytes_are_the_files_and_reported(mixtral: ModelSource) -> None:
    assert isinstance(mixtral, GGUFSource)
    config = mixtral.config
    stage = _stage(mixtral, 0, config.num_layers)
    gguf_bytes = sum(info.nbytes for info in mixtral._file.tensors.values())
    ratio = stage.weight_bytes / gguf_bytes
    print(f"held {stage.weight_bytes} bytes, GGUF tensors {gguf_bytes} ({ratio:.3f}x)")
    assert ratio <= 1.3
    capacity = measure_capacity(
        mixtral,
        device="cpu",
        dtype="auto",
        weights="native",
        block_size=4,
        memory_limit_mb=None,
        kv_cache_memory_mb=None,
    )
    for index, layer in enumerate(stage.model.layers):
        # `mohawk model inspect`'s figure, the heartbeat's (measured on a one-layer stage), the stage's
        assert layer_weight_bytes(mixtral, index, "native", "float32") == _held(layer)
        assert capacity.layer_weight_bytes == _held(layer)
    report = torch_report(mixtral, "native", "cpu")
    experts = {g.held: g.num for g in report.groups if g.part == MOE_PART}
    num = config.num_experts * config.num_layers
    assert experts == {
        "int4 from Q4_K + int8 groupwise from Q8_0": num,  # each expert's gate/up
        "int8 groupwise from Q6_K": num,  # its down
        "float32": config.num_layers,  # the routers, stored F32
    }
    assert all(g.dequantized is None for g in report.groups if g.part == MOE_PART)
