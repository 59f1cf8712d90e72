"""MLX backend: a layer range of a Llama-family model on MLX, run by mlx-lm's own model classes.

Design. The stage's layers are mlx-lm `TransformerBlock`s (and its embedding, final norm and LM
head where the stage holds them), built from an mlx-lm `ModelArgs` with the stage's layer count,
and loaded with this project's weights under mlx-lm's parameter names; nothing of the model is
rewritten here. The RoPE base is passed from our config, because mlx-lm's llama reads only a
top-level `rope_theta` and falls back to 10000 without a word (transformers 5 keeps it under
`rope_parameters`). The KV cache is the project's paged cache, as on a torch stage: per layer one
array of keys and one of values, `[num_blocks × block_size, kv_heads, head_dim]`. mlx-lm's
attention reaches it through `PagedLayerCache`, an object with mlx-lm's cache interface (`offset`,
`update_and_fetch`) that writes a sequence's new keys and values into its slots and hands back its
whole context, gathered through its block table. So block ids mean on an MLX stage what they mean
on a torch stage: prefix blocks shared by stage 0's block manager are reused as they are, and a
cancelled sequence's blocks are simply reused. The sequences of a step run one after another
(mlx-lm's attention takes one offset per batch row); that is the thing to batch for speed on Apple
Silicon, while on a Linux CPU MLX is here for correctness and for mixing with torch stages.
Sampling turns the logits rows into a torch CPU tensor and uses the torch stage's sampler, so
both backends sample identically. Matmul weights are held as `mlx_quant` decides from the weight
format: a GGUF file's Q4_0/Q4_1/Q8_0 tensors as mlx-lm's `QuantizedLinear`/`QuantizedEmbedding`
(swapped in by `nn.quantize` before loading) with the file's own blocks as their groups, so a
4-bit stage computes with exactly the values a float32 stage holds and hands on the same hidden
states; everything else in the compute dtype (or bf16/fp32 when asked).
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import structlog
import torch

from mohawk_common.errors import ConfigError
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.config import ModelConfig
from mohawk_common.model_store.source import expected_shape, weight_names
from mohawk_shard.backends.batch import ForwardBatch
from mohawk_shard.backends.mlx_quant import (
    GROUP_SIZE,
    QuantizedWeight,
    held_bits,
    quantize_weight,
)
from mohawk_shard.backends.sampler import Sampler, SamplingRow
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.weight_formats import weights_dtype

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}
_WEIGHT_DTYPES = {"bf16": mx.bfloat16, "fp32": mx.float32}  # formats that fix the held dtype
# mlx-lm module per architecture (Mistral's decoder is llama's)
_MODULES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
log = structlog.get_logger("mohawk.shard.mlx")


def model_args(config: ModelConfig, num_layers: int) -> Any:
    """mlx-lm's ModelArgs for `num_layers` layers of `config`, RoPE base and scaling explicit."""
    module = importlib.import_module(f"mlx_lm.models.{_MODULES[config.architecture]}")
    fields = {
        "model_type": config.architecture,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": num_layers,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
    }
    return module.ModelArgs.from_dict(fields), module


class PagedLayerCache:
    """mlx-lm's cache interface over one layer of the paged KV store, for one sequence and one step."""

    def __init__(self, store: list[mx.array], slots: mx.array, offset: int) -> None:
        self._store = store  # [keys, values], each [num_slots, kv_heads, head_dim]
        self._slots = slots  # KV slots of positions [0, context length)
        self.offset = offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write the step's keys/values ([1, kv_heads, n, head_dim]); return the whole context's."""
        count = keys.shape[2]
        new = self._slots[self.offset : self.offset + count]
        self._store[0][new] = keys[0].transpose(1, 0, 2)
        self._store[1][new] = values[0].transpose(1, 0, 2)
        context_keys = self._store[0][self._slots].transpose(1, 0, 2)[None]
        context_values = self._store[1][self._slots].transpose(1, 0, 2)[None]
        return context_keys, context_values


class MlxBackend:
    name = "mlx"

    def __init__(
        self,
        source: ModelSource,
        start: int,
        end: int,
        *,
        device: str = "auto",
        dtype: str = "auto",
        weights: str = "native",
    ) -> None:
        config = source.config
        if config.architecture not in _MODULES:
            raise ConfigError(f"the mlx backend does not run {config.architecture!r} models")
        if config.sliding_window is not None:
            # mlx-lm's llama/qwen2 attend to the whole context: past the window its answers would
            # differ from the torch stages', which mask it as transformers does
            raise ConfigError(
                f"the mlx backend does not mask sliding windows (this model's is {config.sliding_window} "
                "tokens): run it on torch"
            )
        if device not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"the mlx backend runs on cpu or gpu, not {device!r}")
        if device != "auto":
            mx.set_default_device(mx.cpu if device == "cpu" else mx.gpu)
        self.device = f"mlx:{mx.default_device()}"
        name = weights_dtype(weights, dtype)  # checks `weights`; auto is fp32 on MLX
        self.weights = weights
        name = "float32" if name == "auto" else name
        if name not in _DTYPES:
            raise ConfigError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}")
        self.dtype = _DTYPES[name]
        self.config = config
        self.start, self.end = start, end
        self.has_embedding, self.has_head = start == 0, end == config.num_layers
        args, module = model_args(config, end - start)
        model = module.Model(args)  # parameters are lazy: only what is loaded below is ever made
        self._weights = self._load(model, source)
        self.layers = list(model.model.layers)
        self.embed_tokens = model.model.embed_tokens if self.has_embedding or self._tied_head else None
        self.norm = model.model.norm if self.has_head else None
        self.lm_head = model.lm_head if self.has_head and not config.tie_word_embeddings else None
        self.kv: list[list[mx.array]] = []
        self.sampler = Sampler(config.eos_token_ids) if self.has_head else None

    def _load(self, model: nn.Module, source: ModelSource) -> list[mx.array]:
        """Load the stage's weights into `model` in their formats (see `mlx_quant`); the arrays held."""
        held = _WEIGHT_DTYPES.get(self.weights, self.dtype)
        names = weight_names(
            self.config, self.start, self.end, embedding=self.has_embedding, head=self.has_head
        )
        floats: list[tuple[str, mx.array]] = []
        quantized: dict[str, QuantizedWeight] = {}  # module path -> weight
        formats: Counter[str] = Counter()
        for name in names:
            mlx_name = self._mlx_name(name)
            if mlx_name is None:
                continue
            stored = source.stored_format(name)
            bits = _held_bits(name, stored, expected_shape(self.config, name)[-1], self.weights)
            if bits is None:
                floats.append((mlx_name, mx.array(source.read_tensor(name)).astype(held)))
                formats[_NAMES[held]] += 1
            else:
                quantized[mlx_name.removesuffix(".weight")] = quantize_weight(source, name, bits, self.dtype)
                formats[f"{bits}-bit from {stored}"] += 1
        nn.quantize(model, class_predicate=lambda path, _: _group_params(quantized.get(path)))
        for path, weight in quantized.items():
            floats += [(f"{path}.{key}", getattr(weight, key)) for key in ("weight", "scales", "biases")]
        model.load_weights(floats, strict=False)
        arrays = [array for _, array in floats]
        mx.eval(arrays)
        log.info(
            "mlx stage weights loaded",
            layers=f"[{self.start}, {self.end})",
            weights=self.weights,
            formats=dict(formats),
            weight_bytes=sum(int(a.nbytes) for a in arrays),
        )
        return arrays

    @property
    def _tied_head(self) -> bool:
        return self.has_head and self.config.tie_word_embeddings

    def _mlx_name(self, name: str) -> str | None:
        if name.startswith("layers."):
            index, rest = name[len("layers.") :].split(".", 1)
            return f"model.layers.{int(index) - self.start}.{rest}"
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            # a tied head is the embedding matrix: the first stage has it already, the last loads it
            return None if self.has_embedding else "model.embed_tokens.weight"
        if name == "lm_head.weight":
            return name
        return f"model.{name}"

    @property
    def weight_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self._weights)

    def kv_bytes_per_block(self, block_size: int) -> int:
        per_slot = 2 * self.config.num_kv_heads * self.config.head_dim * self.dtype.size
        return (self.end - self.start) * block_size * per_slot

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        shape = (num_blocks * block_size, self.config.num_kv_heads, self.config.head_dim)
        self.kv = [[mx.zeros(shape, self.dtype), mx.zeros(shape, self.dtype)] for _ in self.layers]
        mx.eval(self.kv)

    def forward(self, batch: ForwardBatch, hidden: mx.array | None) -> mx.array:
        if self.has_embedding:
            if self.embed_tokens is None:
                raise ValueError("the first stage holds the embedding")
            inputs = self.embed_tokens(mx.array(batch.token_ids))
        elif hidden is None:
            raise ValueError("a stage without the embedding needs hidden states from the stage before")
        else:
            inputs = hidden.astype(self.dtype)
        context_slots = batch.context_slots()
        outputs, row = [], 0
        for index in range(batch.num_seqs):
            count, context = int(batch.query_lens[index]), int(batch.context_lens[index])
            offset = context - count
            slots = mx.array(context_slots[index, :context])
            mask = _causal_mask(count, offset) if count > 1 else None
            h = inputs[row : row + count][None]
            for layer, store in zip(self.layers, self.kv, strict=True):
                h = layer(h, mask, cache=PagedLayerCache(store, slots, offset))
            outputs.append(h[0])
            row += count
        out = mx.concatenate(outputs, axis=0) if len(outputs) > 1 else outputs[0]
        if self.has_head:
            out = self._logits(out[mx.array(batch.logits_rows)])
        mx.eval(out, self.kv)
        return out

    def _logits(self, hidden: mx.array) -> mx.array:
        if self.norm is None:
            raise ValueError("only the last stage computes logits")
        hidden = self.norm(hidden)
        if self.lm_head is not None:
            return self.lm_head(hidden).astype(mx.float32)
        if self.embed_tokens is None:
            raise ValueError("a tied LM head needs the embedding")
        return self.embed_tokens.as_linear(hidden).astype(mx.float32)

    def sample(
        self, logits: mx.array, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]
    ) -> list[SampledToken]:
        if self.sampler is None:
            raise ValueError("only the last stage samples")
        rows = [SamplingRow(p, o) for p, o in zip(params, outputs, strict=True)]
        return self.sampler.sample(torch.from_numpy(np.array(logits, copy=True)), rows)

    def encode_hidden(self, hidden: mx.array) -> tuple[str, list[int], bytes]:
        """(dtype name, shape, raw little-endian bytes), with no detour through Python lists."""
        name = _NAMES.get(hidden.dtype)
        if name is None:
            raise ValueError(f"hidden states of dtype {hidden.dtype} cannot cross the wire")
        raw = hidden.view(mx.uint16) if hidden.dtype == mx.bfloat16 else hidden
        return name, list(hidden.shape), np.asarray(raw).tobytes()

    def decode_hidden(self, dtype: str, shape: Sequence[int], data: bytes) -> mx.array:
        if dtype == "bfloat16":
            return mx.array(np.frombuffer(data, dtype=np.uint16)).view(mx.bfloat16).reshape(tuple(shape))
        if dtype not in _DTYPES:
            raise ValueError(f"unknown hidden-state dtype {dtype!r}")
        return mx.array(np.frombuffer(data, dtype=np.dtype(dtype))).reshape(tuple(shape))


def _held_bits(name: str, stored: str, columns: int, weights: str) -> int | None:
    """`mlx_quant.held_bits`, with a log line for each weight held otherwise than asked."""
    bits, reason = held_bits(name, stored, columns, weights)
    if reason is not None:
        log.warning("MLX holds this weight in the compute dtype", tensor=name, format=stored, reason=reason)
    return bits


def _group_params(weight: QuantizedWeight | None) -> dict[str, int] | bool:
    """`nn.quantize`'s answer for one module: its group size and bits, or False to leave it."""
    return False if weight is None else {"group_size": GROUP_SIZE, "bits": weight.bits}


def _causal_mask(count: int, offset: int) -> mx.array:
    """[count, offset + count]: query i (at position offset + i) sees positions 0 … offset + i."""
    rows = mx.arange(count)[:, None] + offset
    return mx.arange(offset + count)[None, :] <= rows
