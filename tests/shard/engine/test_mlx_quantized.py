"""MLX stages holding 4- and 8-bit weights: GGUF blocks copied exactly into MLX's affine groups,
the bytes a stage holds, int4 on a float model, and 4-bit stages in MLX-only and torch+MLX pipelines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.gguf_source import gguf_tensor_name
from mohawk_common.model_store.source import layer_names
from mohawk_shard.backends import make_backend
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import layer_ranges
from mohawk_shard.model.forward_batch import ForwardBatch

from .test_architectures import build_tiny

pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")

import mlx.core as mx
import mlx.nn as nn
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mohawk_shard.backends.mlx_backend import MlxBackend
from mohawk_shard.backends.mlx_quant import affine_groups, from_stored, pack

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primary colours."]


def stage_logits(
    source: ModelSource, token_ids: list[int], split: Sequence[int], backends: Sequence[str], weights: str
) -> torch.Tensor:
    """Logits at every position of one prompt through stages on `backends`, MLX stages in `weights`."""
    ranges = layer_ranges(source.config.num_layers, split)
    batch = ForwardBatch.build([(token_ids, 0, [0], True)], 64, all_logits=True)
    hidden: Any = None
    previous: Any = None
    for (start, end), name in zip(ranges, backends, strict=True):
        backend = make_backend(
            name,
            source,
            start,
            end,
            device="cpu",
            dtype="float32",
            weights=weights if name == "mlx" else "fp32",
            kv_cache_dtype="float32",  # as MLX holds it at fp32
        )
        backend.allocate_kv_cache(1, 64)
        if previous is not None and previous.name != backend.name:
            hidden = backend.decode_hidden(*previous.encode_hidden(hidden))
        hidden = backend.forward(batch, hidden)
        previous = backend
    return hidden if previous.name == "torch" else torch.from_numpy(np.array(hidden, copy=True))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_unpack_to_the_dequantized_values(kind: str) -> None:
    tensor_type = GGMLQuantizationType[kind]
    values = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    raw = quantize(values, tensor_type)
    expected = dequantize(raw, tensor_type).reshape(values.shape)
    q, scales, biases = affine_groups(decode_gguf_blocks(raw, kind, values.shape))
    bits = 8 if kind == "Q8_0" else 4
    ours = mx.dequantize(
        mx.array(pack(q, bits)), mx.array(scales), mx.array(biases), group_size=32, bits=bits
    )
    assert np.abs(np.array(ours) - expected).max() == 0.0


def test_bundled_blocks_are_held_exactly(bundled: ModelSource) -> None:
    """Q4_1 layers (q/k rows un-permuted like the source does) and the Q8_0 embedding, bit for bit;
    `mx.quantize` on the same values would be off by up to half a step."""
    names = [
        "layers.4.self_attn.q_proj.weight",
        "layers.4.self_attn.k_proj.weight",
        "layers.4.mlp.down_proj.weight",
    ]
    floats = bundled.load_weights(4, 5, embedding=True, head=False)
    for name in [*names, "embed_tokens.weight"]:
        error = np.abs(np.array(from_stored(bundled, name, mx.float32).dequantize()) - floats[name]).max()
        print(f"{name}: max |error| {error:.1e}")
        assert error == 0.0, name


def test_4bit_stage_holds_at_most_gguf_bytes_and_a_quarter(bundled: ModelSource) -> None:
    start, end = 3, 6
    stage = MlxBackend(bundled, start, end, device="cpu")  # native: the file's Q4_1
    assert all(isinstance(layer.mlp.down_proj, nn.QuantizedLinear) for layer in stage.layers)
    tensors = bundled._file.tensors  # type: ignore[attr-defined]
    names = [name for layer in range(start, end) for name in layer_names(bundled.config, layer)]
    gguf_bytes = sum(tensors[gguf_tensor_name(name)].nbytes for name in names)
    fp32 = make_backend("mlx", bundled, start, end, device="cpu", weights="fp32")
    print(f"[{start}, {end}) bytes: GGUF {gguf_bytes}, 4-bit {stage.weight_bytes}, fp32 {fp32.weight_bytes}")
    assert stage.weight_bytes <= 1.25 * gguf_bytes
    assert fp32.weight_bytes > 4 * stage.weight_bytes


def test_int4_on_a_float_model_quantizes_every_projection(bundled: ModelSource, tmp_path: Path) -> None:
    """A safetensors model under int4: every projection `mx.quantize`d, within one step of its
    float value (its groups make their largest value exact and may clip the other end), the
    untied LM head kept float, and the stage still runs."""
    build_tiny("llama-mha-untied", tmp_path, bundled.load_tokenizer())
    source = open_model(tmp_path)
    stage = MlxBackend(source, 0, source.config.num_layers, device="cpu", weights="int4")
    assert all(isinstance(layer.self_attn.q_proj, nn.QuantizedLinear) for layer in stage.layers)
    assert isinstance(stage.lm_head, nn.Linear)
    held = stage.layers[1].mlp.up_proj
    floats = source.load_weights(1, 2, embedding=False, head=False)["layers.1.mlp.up_proj.weight"]
    error = np.abs(
        np.array(mx.dequantize(held.weight, held.scales, held.biases, group_size=32, bits=4)) - floats
    )
    step = np.repeat(np.abs(np.array(held.scales)), 32, axis=1)
    assert (error <= step * (1 + 1e-5)).all()
    logits = stage_logits(source, [5, 900, 17, 4000, 33, 2, 777], (), ["mlx"], "int4")
    assert logits.shape == (7, source.config.vocab_size) and torch.isfinite(logits).all()


def test_mixed_torch_and_4bit_mlx_pipeline_matches_torch(bundled: ModelSource) -> None:
    """torch [0, 10) hands fp32 hidden states to a 4-bit MLX stage [10, 30) and back: since the
    4-bit groups hold the GGUF values exactly, the logits are the all-torch fp32 logits."""
    ids = bundled.load_tokenizer()("The capital of France is a city called")["input_ids"]
    torch_only = stage_logits(bundled, ids, (), ["torch"], "fp32")
    mixed = stage_logits(bundled, ids, (10,), ["torch", "mlx"], "native")
    diff = (mixed - torch_only).abs().max().item()
    print(f"torch + MLX 4-bit vs torch fp32: max |logit difference| {diff:.2e}")
    assert diff < 1e-3


@pytest.mark.slow
@pytest.mark.full_form  # 44 s here; test_mixed_torch_and_4bit_mlx_pipeline_matches_torch checks the logits
def test_4bit_mlx_greedy_text_equals_fp32_mlx(bundled: ModelSource, engine_factory: Any) -> None:
    tokenizer = bundled.load_tokenizer()
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    # MLX on a Linux CPU decodes the sequences one after another (about 7 tokens/s each here):
    # 24 tokens take 35 s of the 53 that 48 took (pytest --durations)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    texts = {}
    for weights in ("native", "fp32"):
        engine = engine_factory(split=(15,), backends=("mlx", "mlx"), weights=weights)
        texts[weights] = [c.text for c in engine.generate(prompts, greedy)]
    assert all(len(text) > 10 for text in texts["fp32"])
    assert texts["native"] == texts["fp32"]


def test_bf16_and_fp32_formats_hold_float_weights(bundled: ModelSource) -> None:
    """bf16/fp32 hold every weight unquantized in that dtype (bf16 also the compute dtype under
    dtype auto); an explicit float32 compute dtype keeps float32 hidden states over bf16 weights."""
    fp32 = MlxBackend(bundled, 3, 5, device="cpu", weights="fp32")
    bf16 = MlxBackend(bundled, 3, 5, device="cpu", weights="bf16")
    mixed = MlxBackend(bundled, 3, 5, device="cpu", dtype="float32", weights="bf16")
    assert isinstance(bf16.layers[0].mlp.up_proj, nn.Linear)
    assert bf16.weight_bytes * 2 == fp32.weight_bytes == mixed.weight_bytes * 2
    assert (bf16.dtype, mixed.dtype) == (mx.bfloat16, mx.float32)
    batch = ForwardBatch.build([([1, 2, 3], 0, [0], True)], 16)
    mixed.allocate_kv_cache(1, 16)
    hidden = mixed.forward(batch, mx.ones((3, bundled.config.hidden_size)))
    assert hidden.dtype == mx.float32


def test_a_4bit_last_stage_survives_a_step_that_samples_nothing(bundled: ModelSource) -> None:
    """A prompt chunk short of its prompt's end asks for no logits: the stage answers an empty
    [0, vocab] without calling the quantized head (mlx-cpu's quantized matmul over 0 rows raises
    SIGFPE, which killed the process), and the next chunk samples as usual."""
    last = MlxBackend(bundled, 28, 30, device="cpu", weights="native")
    last.allocate_kv_cache(2, 16)
    hidden = mx.ones((3, bundled.config.hidden_size))
    silent = last.forward(ForwardBatch.build([([1, 2, 3], 0, [0], False)], 16), hidden)
    assert silent.shape == (0, bundled.config.vocab_size)
    sampled = last.forward(ForwardBatch.build([([4, 5, 6], 3, [0], True)], 16), hidden)
    assert sampled.shape == (1, bundled.config.vocab_size)
