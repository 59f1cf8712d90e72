"""MLX backend: a layer range of any architecture Mohawk reads, run by mlx-lm's own model classes.

Design. The stage's layers are mlx-lm's decoder blocks of the model's architecture (and its
embedding, final norm and LM head where the stage holds them), built by `mlx_models` from an
mlx-lm `ModelArgs` mapped explicitly from our config (mlx-lm's llama, for one, reads only a
top-level `rope_theta` and falls back to 10000 without a word; transformers 5 keeps it under
`rope_parameters`), and loaded with this project's weights under mlx-lm's parameter names;
nothing of the model is rewritten here. The KV cache is the project's paged cache, as on a torch
stage, and grouped as there (`mohawk_common.kv_groups`): `page_layers` pairs of arrays
`[num_blocks × block_size, kv_heads, head_dim]`, the j-th layer of each KV group in the stage
using pair j through its group's block table. mlx-lm's attention reaches it through
`PagedLayerCache`, an object with mlx-lm's cache interface (`offset`, `update_and_fetch`) that
writes a sequence's new keys and values into its slots and hands back the context it holds,
gathered through its block table. A sliding layer's table starts at the first block its window
still needs (stage 0's block manager has given the earlier ones back, `NULL_BLOCK`), and its
mask, built here, lets a query at p see keys in (p − window, p], as transformers and the torch
stage do. So block ids mean on an MLX stage what they mean on a torch stage: prefix blocks shared
by stage 0's block manager are reused as they are, and a cancelled sequence's blocks are simply
reused. The sequences of a step run one after another (mlx-lm's attention takes one offset per
batch row); that is the thing to batch for speed on Apple Silicon, while on a Linux CPU MLX is
here for correctness and for mixing with torch stages. Sampling turns the logits rows into a
torch CPU tensor and uses the torch stage's sampler, so both backends sample identically. Matmul
weights are held as `mlx_quant` decides from the weight format and the compute dtype: a GGUF
file's Q4_0/Q4_1/Q4_K/Q5_x/Q8_0 tensors as mlx-lm's `QuantizedLinear`/`QuantizedEmbedding`/
`QuantizedSwitchLinear` (swapped in by `nn.quantize` before loading) with the file's own groups,
their scales exact in float32 (the default; so a quantized stage computes with exactly the values
a float32 stage holds) and rounded, as the log says, in a narrower dtype; everything else in the
compute dtype.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import structlog
import torch

from mohawk_common.errors import ConfigError
from mohawk_common.kv_groups import group_of_layer, model_kv_groups, page_layers, tensor_slots
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.source import LM_HEAD, expected_shape, weight_names
from mohawk_shard.backends import mlx_models
from mohawk_shard.backends.mlx_quant import (
    GROUP_SIZE,
    QuantizedWeight,
    held_bits,
    quantize_weight,
    scale_rounding,
)
from mohawk_shard.backends.sampler import Sampler, SamplingRow
from mohawk_shard.config import engine_choice
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.weight_formats import weights_dtype

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}
_WEIGHT_DTYPES = {"bf16": mx.bfloat16, "fp32": mx.float32}  # formats that fix the held dtype
log = structlog.get_logger("mohawk.shard.mlx")


class PagedLayerCache:
    """mlx-lm's cache interface over one layer of the paged KV store, for one sequence and one step.

    `offset` is the step's first position (what mlx-lm rotates by); `slots` are the KV slots of
    positions [first, context length), `first` 0 except on a sliding layer whose earlier blocks
    are gone."""

    def __init__(self, store: list[mx.array], slots: mx.array, offset: int, first: int = 0) -> None:
        self._store = store  # [keys, values], each [num_slots, kv_heads, head_dim]
        self._slots = slots
        self.offset = offset
        self._first = first

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write the step's keys/values ([1, kv_heads, n, head_dim]); return the held context's."""
        count, start = keys.shape[2], self.offset - self._first
        new = self._slots[start : start + count]
        self._store[0][new] = keys[0].transpose(1, 0, 2)
        self._store[1][new] = values[0].transpose(1, 0, 2)
        context_keys = self._store[0][self._slots].transpose(1, 0, 2)[None]
        context_values = self._store[1][self._slots].transpose(1, 0, 2)[None]
        return context_keys, context_values


class _Stage(nn.Module):
    """The stage's mlx-lm modules under the names its weights load by (`mlx_models.target`)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = layers


class MlxBackend:
    name = "mlx"

    def __init__(
        self,
        source: ModelSource,
        start: int,
        end: int,
        *,
        device: str | None = None,
        dtype: str | None = None,
        weights: str | None = None,
    ) -> None:
        device, dtype = engine_choice("device", device), engine_choice("dtype", dtype)
        weights = engine_choice("weights", weights)
        config = source.config
        if config.architecture not in mlx_models.MODULES:
            raise ConfigError(f"the mlx backend does not run {config.architecture!r} models")
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
        # KV groups as on a torch stage (`mohawk_common.kv_groups`): the j-th layer of each group
        # in the stage uses KV pair j, read through its group's table
        groups = model_kv_groups(config)
        owner = group_of_layer(groups, config.num_layers)
        self.layer_groups = owner[start:end]
        self.windows = [groups[g].window for g in self.layer_groups]
        self.page_layers = page_layers(owner, start, end)
        self._tensor_slots = tensor_slots(owner, start, end)
        args, module = mlx_models.model_args(config)
        hf_config = source.hf_config if config.rope_scaling is not None else None  # scaled rope only
        stage = _Stage([mlx_models.make_layer(config, hf_config, args, module, i) for i in range(start, end)])
        # parameters are lazy: only what is loaded below is ever made
        if self.has_embedding or self._tied_head:
            stage.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if self.has_head:
            stage.norm = mlx_models.make_norm(config, module)
            if not config.tie_word_embeddings:
                stage.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._weights = self._load(stage, source)
        self.layers = list(stage.layers)
        self.embed_tokens = stage.get("embed_tokens")
        self.norm = stage.get("norm")
        self.lm_head = stage.get("lm_head")
        self._embed_scale = mlx_models.embed_scale(config)
        self.kv: list[list[mx.array]] = []
        self.sampler = Sampler(config.eos_token_ids) if self.has_head else None

    def _load(self, stage: nn.Module, source: ModelSource) -> list[mx.array]:
        """Load the stage's weights into `stage` in their formats (see `mlx_quant`); the arrays held."""
        held = _WEIGHT_DTYPES.get(self.weights, self.dtype)
        names = weight_names(
            self.config, self.start, self.end, embedding=self.has_embedding, head=self.has_head
        )
        targets: dict[str, mlx_models.Target] = {}
        parts: dict[str, dict[int, mx.array | QuantizedWeight]] = {}
        formats: Counter[str] = Counter()
        for name in names:
            target = self._target(name)
            if target is None:
                continue
            stored = source.stored_format(name)
            columns = expected_shape(self.config, name)[-1]
            bits = _held_bits(name, stored, columns, self.weights)
            if bits is None:
                value: mx.array | QuantizedWeight = mx.array(source.read_tensor(name)).astype(held)
                formats[_NAMES[held]] += 1
            else:
                value = quantize_weight(source, name, bits, self.dtype)
                formats[f"{bits}-bit from {stored}"] += 1
                rounding = scale_rounding(stored, _NAMES[self.dtype])
                if rounding is not None and formats[f"{bits}-bit from {stored}"] == 1:
                    log.info("MLX holds these scales in the compute dtype", format=stored, note=rounding)
            targets[target.path] = target
            parts.setdefault(target.path, {})[target.index] = value
        floats: list[tuple[str, mx.array]] = []
        quantized: dict[str, QuantizedWeight] = {}  # module path -> weight
        for path, got in parts.items():
            target, values = targets[path], [got[i] for i in sorted(got)]
            kinds = {v.bits if isinstance(v, QuantizedWeight) else None for v in values}
            if len(kinds) == 1 and None not in kinds:
                qs = [v for v in values if isinstance(v, QuantizedWeight)]
                quantized[path.removesuffix(".weight")] = QuantizedWeight(
                    qs[0].bits, *(mlx_models.combine(target, [getattr(q, k) for q in qs]) for k in _QUANTIZED)
                )
                continue
            if len(kinds) > 1:  # one mlx-lm matrix of parts held differently: all in the compute dtype
                log.warning(
                    "MLX holds this fused weight in the compute dtype", tensor=path, reason="parts differ"
                )
            floats.append((path, mlx_models.combine(target, [_as_float(v, held) for v in values])))
        nn.quantize(stage, class_predicate=lambda path, _: _group_params(quantized.get(path)))
        for path, weight in quantized.items():
            floats += [(f"{path}.{key}", getattr(weight, key)) for key in _QUANTIZED]
        stage.load_weights(floats)  # strict: every parameter of the stage, by its mlx-lm name
        arrays = [array for _, array in floats]
        mx.eval(arrays)
        log.info(
            "mlx stage weights loaded",
            architecture=self.config.architecture,
            layers=f"[{self.start}, {self.end})",
            weights=self.weights,
            formats=dict(formats),
            weight_bytes=sum(int(a.nbytes) for a in arrays),
        )
        return arrays

    @property
    def _tied_head(self) -> bool:
        return self.has_head and self.config.tie_word_embeddings

    def _target(self, name: str) -> mlx_models.Target | None:
        if name == LM_HEAD and self.config.tie_word_embeddings:
            # a tied head is the embedding matrix: the first stage has it already, the last loads it
            return None if self.has_embedding else mlx_models.Target("embed_tokens.weight")
        return mlx_models.target(self.config, name, self.start)

    @property
    def weight_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self._weights)

    def kv_bytes_per_block(self, block_size: int) -> int:
        per_slot = 2 * self.config.num_kv_heads * self.config.head_dim * self.dtype.size
        return self.page_layers * block_size * per_slot

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        shape = (num_blocks * block_size, self.config.num_kv_heads, self.config.head_dim)
        pages = [[mx.zeros(shape, self.dtype), mx.zeros(shape, self.dtype)] for _ in range(self.page_layers)]
        mx.eval(pages)
        self.kv = [pages[j] for j in self._tensor_slots]

    def forward(self, batch: ForwardBatch, hidden: mx.array | None) -> mx.array:
        if len(set(self.layer_groups)) > 1 and not batch.group_tables:
            raise ValueError(f"layers [{self.start}, {self.end}) need a block table per KV group")
        if self.has_embedding:
            if self.embed_tokens is None:
                raise ValueError("the first stage holds the embedding")
            inputs = self.embed_tokens(mx.array(batch.token_ids))
            if self._embed_scale is not None:
                inputs = inputs * mx.array(self._embed_scale, self.dtype)
        elif hidden is None:
            raise ValueError("a stage without the embedding needs hidden states from the stage before")
        else:
            inputs = hidden.astype(self.dtype)
        views = {
            (group, window): _GroupView(batch, group, window)
            for group, window in zip(self.layer_groups, self.windows, strict=True)
        }
        outputs, row = [], 0
        for index in range(batch.num_seqs):
            count, context = int(batch.query_lens[index]), int(batch.context_lens[index])
            offset = context - count
            h = inputs[row : row + count][None]
            steps = {key: view.sequence(index, count, offset) for key, view in views.items()}
            for layer, store, group, window in zip(
                self.layers, self.kv, self.layer_groups, self.windows, strict=True
            ):
                slots, first, mask = steps[(group, window)]
                h = layer(h, mask, cache=PagedLayerCache(store, slots, offset, first))
            outputs.append(h[0])
            row += count
        out = mx.concatenate(outputs, axis=0) if len(outputs) > 1 else outputs[0]
        if self.has_head and batch.logits_rows.shape[0] == 0:
            # a step that samples nothing (a prompt chunk short of its end): mlx-cpu's quantized
            # matmul over 0 rows dies with SIGFPE, which would take the whole node down
            out = mx.zeros((0, self.config.vocab_size), mx.float32)
        elif self.has_head:
            out = self._logits(out[mx.array(batch.logits_rows)])
        mx.eval(out, self.kv)
        return out

    def _logits(self, hidden: mx.array) -> mx.array:
        if self.norm is None:
            raise ValueError("only the last stage computes logits")
        hidden = self.norm(hidden)
        if self.lm_head is not None:
            logits = self.lm_head(hidden).astype(mx.float32)
        elif self.embed_tokens is None:
            raise ValueError("a tied LM head needs the embedding")
        else:
            logits = self.embed_tokens.as_linear(hidden).astype(mx.float32)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * mx.tanh(logits / cap)

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


_QUANTIZED = ("weight", "scales", "biases")


class _GroupView:
    """One KV group's side of a step: each sequence's slots from the first block it still holds,
    and the mask of its queries over them (causal, and within the window on a sliding layer)."""

    def __init__(self, batch: ForwardBatch, group: int, window: int | None) -> None:
        view = batch.for_group(group)
        if window is not None:
            view = view.from_window(window)
        self.window = window
        self.first = batch.context_lens - view.context_lens  # positions before the held blocks
        self.slots = view.context_slots()

    def sequence(self, index: int, count: int, offset: int) -> tuple[mx.array, int, mx.array | None]:
        """(slots of the held context, its first position, mask or None) of sequence `index`."""
        first = int(self.first[index])
        held = offset + count - first
        slots = mx.array(self.slots[index, :held])
        if self.window is None or offset + count <= self.window:
            return slots, first, _causal_mask(count, offset) if count > 1 else None
        queries = mx.arange(count)[:, None] + offset
        keys = mx.arange(first, offset + count)[None, :]
        return slots, first, (keys <= queries) & (keys > queries - self.window)


def _as_float(value: mx.array | QuantizedWeight, dtype: mx.Dtype) -> mx.array:
    return value.dequantize().astype(dtype) if isinstance(value, QuantizedWeight) else value


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
