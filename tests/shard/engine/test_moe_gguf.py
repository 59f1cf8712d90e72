"""A tiny Qwen3-MoE GGUF (experts as llama.cpp stores them: one 3-D tensor per matrix kind, the
router as ffn_gate_inp) read back expert by expert, and run: its logits are the safetensors
checkpoint's and transformers'. Mixtral GGUF files: tests/shard/engine/test_gguf_architectures.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from mohawk_cli.model_report import MOE_PART, torch_report
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.gguf_source import gguf_tensor_name

from .conftest import full_logits, reference_logits
from .test_moe_architectures import build_tiny

OPTIONS: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,  # what llama.cpp runs (transformers' GGUF reader defaults it so)
    "head_dim": 16,
}
KINDS = ("gate_proj", "up_proj", "down_proj")


def write_moe_gguf(
    path: Path, source: ModelSource, arch: str = "qwen3moe", experts_type: GGMLQuantizationType | None = None
) -> dict[str, np.ndarray]:
    """The checkpoint of `source` as a GGUF of `arch`; returns the expert tensors written."""
    import gguf
    from gguf.quants import quantize

    config = source.config
    weights = source.load_weights(0, config.num_layers, embedding=True, head=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    stacked: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        if ".experts." not in name:
            writer.add_tensor(gguf_tensor_name(name), array)
    for layer in range(config.num_layers):
        for kind in KINDS:
            parts = [
                weights[f"layers.{layer}.mlp.experts.{e}.{kind}.weight"] for e in range(config.num_experts)
            ]
            name = gguf_tensor_name(f"layers.{layer}.mlp.experts.0.{kind}.weight")
            stacked[name] = np.stack(parts)
            if experts_type is None:
                writer.add_tensor(name, stacked[name])
            else:
                writer.add_tensor(name, quantize(stacked[name], experts_type), raw_dtype=experts_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stacked


@pytest.fixture(scope="module")
def tiny(bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelSource, Any]:
    directory = tmp_path_factory.mktemp("qwen3-moe-gguf")
    model = build_tiny("qwen3-moe-gguf", directory, bundled.load_tokenizer(), OPTIONS)
    return open_model(directory), model


def test_gguf_experts_read_back_and_run(tiny: tuple[ModelSource, Any], tmp_path: Path) -> None:
    checkpoint, model = tiny
    write_moe_gguf(tmp_path / "tiny-moe.gguf", checkpoint)
    source = open_model(tmp_path / "tiny-moe.gguf")
    moe_fields = ("architecture", "qk_norm", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
    for field in (*moe_fields, "norm_topk_prob", "dense_mlp_layers", "head_dim"):
        assert getattr(source.config, field) == getattr(checkpoint.config, field), field
    source.check_tensors()
    name = "layers.2.mlp.experts.3.down_proj.weight"
    np.testing.assert_array_equal(source.read_tensor(name), checkpoint.read_tensor(name))
    prompt = [5, 900, 17, 4000, 33, 2, 777, 12345, 8, 9, 10, 11]
    ours = full_logits(source, prompt, (2,), block_size=4)
    theirs = reference_logits(model, prompt)
    assert (ours - full_logits(checkpoint, prompt, (), block_size=4)).abs().max().item() < 1e-5
    assert (ours - theirs).abs().max().item() < 1e-4 * max(1.0, theirs.abs().max().item())


def test_gguf_quantized_experts_read_per_expert(tiny: tuple[ModelSource, Any], tmp_path: Path) -> None:
    from gguf.quants import dequantize, quantize

    stacked = write_moe_gguf(tmp_path / "q8.gguf", tiny[0], experts_type=GGMLQuantizationType.Q8_0)
    source = open_model(tmp_path / "q8.gguf")
    source.check_tensors()
    for expert in (0, 3):
        whole = stacked["blk.1.ffn_up_exps.weight"]
        decoded = dequantize(quantize(whole, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
        got = source.read_tensor(f"layers.1.mlp.experts.{expert}.up_proj.weight")
        np.testing.assert_array_equal(got, decoded.reshape(whole.shape)[expert])
    report = torch_report(source, "native", "cpu")  # `mohawk model inspect` says so
    held = {(g.held, g.dequantized): g.num for g in report.groups if g.part == MOE_PART}
    num_experts, num_layers = source.config.num_experts, source.config.num_layers
    assert held == {
        ("int8 groupwise from Q8_0", None): 2 * num_experts * num_layers,  # gate/up fused, down
        ("float32", None): num_layers,  # the routers, stored F32
    }
    prompt = [5, 900, 17, 4000, 33]  # native: the experts' Q8_0 codes, the same weights
    native, dense = full_logits(source, prompt, weights="native"), full_logits(source, prompt, weights="fp32")
    # through the int8_rows kernel (int8 activations a group of 32, as llama.cpp's): measured 0.0100
    # of logits up to 1.2 in magnitude
    assert (native - dense).abs().max().item() < 0.02 * dense.abs().max().item()


def test_a_token_routed_alone_or_among_many_gets_the_same_bits(
    tiny: tuple[ModelSource, Any], tmp_path: Path
) -> None:
    """The default (native) experts: each token's output of a MoE layer is the same, bit for bit,
    whether it is the only row of the step or one of 24 routed over every expert (its k outputs
    are added in expert order whatever the other rows pick)."""
    import torch

    from mohawk_shard.backends import make_backend
    from mohawk_shard.model.moe import SparseMoE

    write_moe_gguf(tmp_path / "q8.gguf", tiny[0], experts_type=GGMLQuantizationType.Q8_0)
    source = open_model(tmp_path / "q8.gguf")
    backend = make_backend("torch", source, 0, source.config.num_layers, device="cpu", dtype="auto")
    moe = next(module for module in backend.model.modules() if isinstance(module, SparseMoE))  # type: ignore[attr-defined]
    rows = torch.randn(24, source.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        together = moe(rows)
        routed = moe.route(rows)[0]
        assert len(routed.unique()) == source.config.num_experts  # the batch reaches every expert
        for i in range(rows.shape[0]):
            assert torch.equal(moe(rows[i : i + 1])[0], together[i]), i
