"""Build a `LlamaStage` with each weight in the format the `weights` setting asks for.

Design. The stage is built on the meta device, so no weight memory exists before a format is
chosen. Then each matmul of the stage (fused q/k/v, o, fused gate/up, down, LM head) is decided
on its own: with `native`, tensors the file stores as Q4_0/Q4_1 become `Int4Linear`s built from
the file's own codes (the same weights as the fp32 path); a Q8_0 LM head (SmolLM2's tied
embedding) is ranked 4-bit, the fastest choice measured (1.6 ms a batch-1 head against
4.8 ms fp32 and 6.2 ms bf16, 1 thread, `bench/int4_kernels.py`), and its best logits are
recomputed from the Q8_0 rows, which keeps greedy answers (tests/engine): on CPU both come from
one copy of the table split into nibbles (`SplitQ8Head`, which a tied first stage also looks its
embeddings up in), elsewhere from a re-grouped 4-bit copy beside the Q8_0 rows (`RescoredHead`); anything
else (float tensors, Q8_0 layers, K-quants, a fused matmul whose parts differ) stays dense in the
compute dtype, and the log says which tensors fell back and why. With `int4` every matmul is
4-bit, quantized at load where the file holds something else; `bf16`/`fp32` are dense. A token
table stored groupwise (Q8_0, Q4_x) stays so (`GroupwiseEmbedding`); with `int4`, a float one is
re-grouped to 8 bits. What is left on meta (norms, dense matrices) is then allocated and read.
The decisions themselves are `weight_formats.py`'s, which the heartbeat's byte counts share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import structlog
import torch
from torch import nn

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.quantized import (
    FOUR_BIT_FORMATS,
    GroupQuantized,
    concat_rows,
    quantize_groupwise,
)
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD, weight_names
from mohawk_shard.model.linear import Linear, prefers_transposed
from mohawk_shard.model.llama import LlamaStage
from mohawk_shard.model.quantized_layers import GroupwiseEmbedding, Int4Linear, RescoredHead
from mohawk_shard.model.split_head import SplitHeadEmbedding, SplitQ8Head, split_head_block
from mohawk_shard.model.weight_formats import (
    INT4,
    LAYER_MATMULS,
    embedding_format,
    head_is_rescored,
    head_is_split,
    matmul_format,
)

log = structlog.get_logger("mohawk.shard.weights")


@dataclass(slots=True)
class FormatReport:
    """How a stage holds its weights: tensors per format (`int4 from Q4_1`, `float32`, ...)."""

    counts: Counter[str] = field(default_factory=Counter)
    fallbacks: list[str] = field(default_factory=list)


def build_stage(
    source: ModelSource, start: int, end: int, *, device: torch.device, dtype: torch.dtype, weights: str
) -> tuple[LlamaStage, FormatReport]:
    """Layers [start, end) of `source` (plus embedding / head where the stage holds them)."""
    config = source.config
    embedding, head = start == 0, end == config.num_layers
    with torch.device("meta"):
        model = LlamaStage(config, start, end, embedding=embedding, head=head).to(dtype)
    report = FormatReport()
    if weights in ("native", "int4"):
        _quantize_matmuls(model, source, weights, device, report)
        _quantize_embedding(model, source, weights, device, dtype, report)
        _quantize_head(model, source, weights, device, dtype, report)
    _materialize(model, device)
    model.tie_weights()
    names = weight_names(config, start, end, embedding=embedding, head=head)
    model.load_weights(_LazyTensors(source, names))
    if prefers_transposed(device, dtype):
        model.store_linear_weights_transposed()
    for module in model.modules():
        if isinstance(module, Linear):
            report.counts[str(dtype).removeprefix("torch.")] += 1
    for line in report.fallbacks:
        log.warning("weight format has no kernel here: held dense", detail=line, dtype=str(dtype))
    return model, report


def _quantize_matmuls(
    model: LlamaStage, source: ModelSource, weights: str, device: torch.device, report: FormatReport
) -> None:
    for offset, layer in enumerate(model.layers):
        for path, parts in LAYER_MATMULS.items():
            names = [f"layers.{model.start + offset}.{p}.weight" for p in parts]
            quantized = _four_bit(source, names, weights, is_head=False, report=report)
            if quantized is not None:
                bias = _fused_bias(source, model, names)
                layer.set_submodule(path, Int4Linear(quantized, device, bias))


def _quantize_head(
    model: LlamaStage,
    source: ModelSource,
    weights: str,
    device: torch.device,
    dtype: torch.dtype,
    report: FormatReport,
) -> None:
    if model.lm_head is None:
        return
    if head_is_split(source, weights, device.type):
        table = _stored(source, LM_HEAD)
        block = split_head_block(table, device)
        if block is None:
            log.warning("this CPU's int4 packing is not one the split head reads: head kept twice")
        else:
            _four_bit(source, [LM_HEAD], weights, is_head=True, report=report, read=False)
            model.lm_head = SplitQ8Head(table, device, block)
            if source.config.tie_word_embeddings and model.embed_tokens is not None:
                model.embed_tokens = SplitHeadEmbedding(model.lm_head, dtype)  # one table, not two
            return
    quantized = _four_bit(source, [LM_HEAD], weights, is_head=True, report=report)
    if quantized is None:
        return
    head = Int4Linear(quantized, device)
    if head_is_rescored(source, weights):
        shared = model.embed_tokens if source.config.tie_word_embeddings else None
        if not isinstance(shared, GroupwiseEmbedding):  # the stage holds no tied table to share
            shared = GroupwiseEmbedding(_stored(source, LM_HEAD), device, dtype)
        model.lm_head = RescoredHead(head, shared)
    else:
        model.lm_head = head


def _four_bit(
    source: ModelSource,
    names: list[str],
    weights: str,
    *,
    is_head: bool,
    report: FormatReport,
    read: bool = True,
) -> GroupQuantized | None:
    """4-bit groups for the fused matmul of `names`, or None when it stays dense (or, `read`
    False, once the format is counted)."""
    held = matmul_format(source, names, weights, is_head=is_head)
    if held.fallback is not None:
        report.fallbacks.append(held.fallback)
    if not held.is_int4:
        return None
    report.counts[held.label] += 1
    if not read:
        return None
    if held.held == INT4:
        return concat_rows([_stored(source, n) for n in names])
    parts = [
        _stored(source, n) if f in FOUR_BIT_FORMATS else quantize_groupwise(source.read_tensor(n))
        for n, f in zip(names, held.stored, strict=True)
    ]
    return concat_rows(parts)


def _stored(source: ModelSource, name: str) -> GroupQuantized:
    tensor = source.read_quantized(name)
    if tensor is None:
        raise ModelLoadError(f"{source.path}: {name} is stored 4-bit but its blocks cannot be read")
    return tensor


def _fused_bias(source: ModelSource, model: LlamaStage, names: list[str]) -> torch.Tensor | None:
    if not model.config.attention_bias or ".q_proj." not in names[0]:
        return None
    biases = [source.read_tensor(n.replace(".weight", ".bias")) for n in names]
    return torch.from_numpy(np.concatenate(biases))


def _quantize_embedding(
    model: LlamaStage,
    source: ModelSource,
    weights: str,
    device: torch.device,
    dtype: torch.dtype,
    report: FormatReport,
) -> None:
    if model.embed_tokens is None:
        return
    held = embedding_format(source, weights)
    if held is None:
        return
    if held.from_file:
        table = _stored(source, EMBEDDING)
    else:
        table = quantize_groupwise(source.read_tensor(EMBEDDING), bits=held.bits)
    model.embed_tokens = GroupwiseEmbedding(table, device, dtype)
    report.counts[f"embedding {table.bits}-bit from {table.source_format}"] += 1


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate every parameter still on the meta device (norms and dense matrices) on `device`."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_meta:
                empty = torch.empty_like(param, device=device)
                module._parameters[name] = nn.Parameter(empty, requires_grad=False)


class _LazyTensors(Mapping[str, np.ndarray]):
    """The stage's canonical tensors, each read from the source only when asked for."""

    def __init__(self, source: ModelSource, names: list[str]) -> None:
        self._source, self._names = source, names

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._source.read_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
