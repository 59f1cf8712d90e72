"""Build a `DecoderStage` with each weight in the format the `weights` setting asks for.

Design. The stage is built on the meta device, so no weight memory exists before a format is
chosen. Then each matmul of the stage (fused q/k/v, o, fused gate/up, down, LM head) is decided
on its own (a MoE layer's experts each have their gate/up and down: `layer_matmuls`): with
`native`, tensors the file stores as Q4_0/Q4_1/Q4_K become `Int4Linear`s built
from the file's own codes (the same weights as the fp32 path), and Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 ones
`GroupwiseLinear`s over the file's codes as int8 (`groupwise_linear.py`); a fused matmul whose
parts are held differently (Q4_K_M's q/k Q4_K with v Q6_K) is a `ConcatLinear` of one module per
run of parts held alike, and a tied table whose head is a `GroupwiseLinear` is looked up in the
head's codes (`SharedTableEmbedding`); a Q8_0 LM head (SmolLM2's tied
embedding) is ranked 4-bit, the fastest choice measured (1.6 ms a batch-1 head against
4.8 ms fp32 and 6.2 ms bf16, 1 thread, `bench/int4_kernels.py`), and its best logits are
recomputed from the Q8_0 rows, which keeps greedy answers (tests/shard/engine): on CPU both come from
one copy of the table split into nibbles (`SplitQ8Head`, which a tied first stage also looks its
embeddings up in), elsewhere from a re-grouped 4-bit copy beside the Q8_0 rows (`RescoredHead`);
anything else (float tensors, formats with no decoder, a fused matmul with a float part) stays
dense in the compute dtype, and the log says which tensors fell back and why. With `int4`
every matmul is 4-bit, quantized at load where the file holds something else; `bf16`/`fp32` are
dense. A token table stored in a decodable format (Q8_0, Q4_x, Q5_x, K-quants) stays so
(`GroupwiseEmbedding`); with `int4`, a float one is re-grouped to 8 bits. What is left on meta
(norms, dense matrices) is then allocated and read. The decisions themselves are
`weight_formats.py`'s, which the heartbeat's byte counts share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import structlog
import torch
from torch import nn

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.quantized import (
    FOUR_BIT_FORMATS,
    GroupQuantized,
    StoredBlocks,
    concat_rows,
    quantize_groupwise,
)
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD, weight_names
from mohawk_shard.kernels.repack import int4_from_blocks, int8_from_blocks, q4k_from_blocks
from mohawk_shard.model.groupwise_linear import ConcatLinear, GroupwiseLinear, SharedTableEmbedding
from mohawk_shard.model.linear import Linear, prefers_transposed
from mohawk_shard.model.load_progress import LoadProgress
from mohawk_shard.model.models import DecoderStage, stage_class
from mohawk_shard.model.quantized_layers import GroupwiseEmbedding, Int4Linear, RescoredHead
from mohawk_shard.model.split_head import SplitHeadEmbedding, SplitQ8Head, split_head_fits
from mohawk_shard.model.weight_formats import (
    GROUPWISE,
    INT4,
    MatmulFormat,
    embedding_format,
    head_is_rescored,
    head_is_split,
    layer_matmuls,
    matmul_format,
)

log = structlog.get_logger("mohawk.shard.weights")
_Module = TypeVar("_Module", bound=nn.Module)


@dataclass(slots=True)
class FormatReport:
    """How a stage holds its weights: tensors per format (`int4 from Q4_1`, `float32`, ...)."""

    counts: Counter[str] = field(default_factory=Counter)
    fallbacks: list[str] = field(default_factory=list)


def build_stage(
    source: ModelSource, start: int, end: int, *, device: torch.device, dtype: torch.dtype, weights: str
) -> tuple[DecoderStage, FormatReport]:
    """Layers [start, end) of `source` (plus embedding / head where the stage holds them)."""
    config = source.config
    embedding, head = start == 0, end == config.num_layers
    with torch.device("meta"):
        model = stage_class(config.architecture)(config, start, end, embedding=embedding, head=head).to(dtype)
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
    model: DecoderStage, source: ModelSource, weights: str, device: torch.device, report: FormatReport
) -> None:
    progress = LoadProgress(model.start, model.start + len(model.layers))
    for offset, layer in enumerate(model.layers):
        for path, parts in layer_matmuls(source.config, model.start + offset).items():
            names = [f"layers.{model.start + offset}.{p}.weight" for p in parts]
            held = _decided(source, names, weights, is_head=False, report=report)
            if held is not None:
                bias = _fused_bias(source, model, names)
                layer.set_submodule(path, _held_matmul(source, names, held, device, bias))
        progress.layer_loaded()


def _quantize_head(
    model: DecoderStage,
    source: ModelSource,
    weights: str,
    device: torch.device,
    dtype: torch.dtype,
    report: FormatReport,
) -> None:
    if model.lm_head is None:
        return
    held = _decided(source, [LM_HEAD], weights, is_head=True, report=report)
    if held is None:
        return
    if head_is_split(source, weights, device.type):
        split = _split_head(source, device)
        if split is None:
            log.warning("this CPU's int4 packing is not one the split head reads: head kept twice")
            if _split_head_serves_embedding(model, source, weights, device):  # it was left to the head
                _quantize_embedding(model, source, weights, device, dtype, report, head_split_failed=True)
        else:
            model.lm_head = split
            if source.config.tie_word_embeddings and model.embed_tokens is not None:
                model.embed_tokens = SplitHeadEmbedding(model.lm_head, dtype)  # one table, not two
            return
    if head_is_rescored(source, weights):
        head = Int4Linear(_four_bit(source, [LM_HEAD], held), device)
        shared = model.embed_tokens if source.config.tie_word_embeddings else None
        if not isinstance(shared, GroupwiseEmbedding):  # the stage holds no tied table to share
            shared = GroupwiseEmbedding(_stored(source, LM_HEAD), device, dtype)
        model.lm_head = RescoredHead(head, shared)
    else:
        model.lm_head = _held_matmul(source, [LM_HEAD], held, device, None)
        if _head_shares_table(model, source, weights) and isinstance(model.lm_head, GroupwiseLinear):
            model.embed_tokens = SharedTableEmbedding(model.lm_head, dtype)  # one copy of the table


def _decided(
    source: ModelSource, names: list[str], weights: str, *, is_head: bool, report: FormatReport
) -> MatmulFormat | None:
    """How the fused matmul of `names` is held, counted in `report`; None when it stays dense."""
    held = matmul_format(source, names, weights, is_head=is_head)
    if held.fallback is not None:
        report.fallbacks.append(held.fallback)
    if not held.is_quantized:
        return None
    report.counts[held.label] += 1
    return held


def _held_matmul(
    source: ModelSource, names: list[str], held: MatmulFormat, device: torch.device, bias: torch.Tensor | None
) -> nn.Module:
    """The module running the fused matmul of `names` as `held` says: one `Int4Linear` or
    `GroupwiseLinear`, or a `ConcatLinear` of one per run of parts held alike."""
    if held.is_int4:
        return _int4_module(source, names, held, device, bias)
    runs = [(kind, [names[i] for i in indices]) for kind, indices in held.runs]
    if len(runs) == 1:
        return _run_module(source, *runs[0], device, bias)
    parts = [_run_module(source, kind, run_names, device, None) for kind, run_names in runs]
    return ConcatLinear(parts, None if bias is None else bias.to(device))


def _int4_module(
    source: ModelSource, names: list[str], held: MatmulFormat, device: torch.device, bias: torch.Tensor | None
) -> nn.Module:
    """The file's own 4-bit codes held as `_run_module` holds them, else re-grouped and packed."""
    if held.held == INT4:
        return _run_module(source, INT4, names, device, bias)
    return Int4Linear(_four_bit(source, names, held), device, bias)


def _split_head(source: ModelSource, device: torch.device) -> SplitQ8Head | None:
    """The Q8_0 head split in two (`split_head.py`): from the file's blocks in one compiled pass,
    else from its decoded codes; None where this CPU's int4 packing is not one it reads."""
    blocks = _blocks(source, [LM_HEAD])
    split = None if blocks is None else SplitQ8Head.from_blocks(blocks[0], device)
    if split is not None:
        return _released(source, [LM_HEAD], split)
    table = _stored(source, LM_HEAD)
    return SplitQ8Head.from_table(table, device) if split_head_fits(table, device) else None


def _run_module(
    source: ModelSource, kind: str, names: list[str], device: torch.device, bias: torch.Tensor | None
) -> nn.Module:
    """One run of parts held alike (`MatmulFormat.runs`): 4-bit, or 5-to-8-bit groupwise."""
    blocks = _blocks(source, names)
    formats = "+".join(sorted({source.stored_format(n) for n in names}))
    if kind == INT4:
        packed_k = None if blocks is None else q4k_from_blocks(blocks, device)
        if packed_k is not None:
            return _released(source, names, Int4Linear(packed_k, device, bias, source_format=formats))
        packed4 = None if blocks is None else int4_from_blocks(blocks, device)
        if packed4 is not None:
            return _released(source, names, Int4Linear(packed4, device, bias, source_format=formats))
        return Int4Linear(concat_rows([_stored(source, n) for n in names]), device, bias)
    packed8 = None if blocks is None else int8_from_blocks(blocks, device)
    if packed8 is not None:
        return _released(source, names, GroupwiseLinear(packed8, device, bias, source_format=formats))
    return GroupwiseLinear(concat_rows([_stored(source, n) for n in names]), device, bias)


def _blocks(source: ModelSource, names: list[str]) -> list[StoredBlocks] | None:
    """Each part's blocks as the file stores them, or None where any has no such view."""
    blocks = [source.read_blocks(n) for n in names]
    return None if any(b is None for b in blocks) else [b for b in blocks if b is not None]


def _released(source: ModelSource, names: list[str], module: _Module) -> _Module:
    """`module`, built from `names`' blocks, which the source may now drop from memory."""
    for name in names:
        source.release_blocks(name)
    return module


def _four_bit(source: ModelSource, names: list[str], held: MatmulFormat) -> GroupQuantized:
    """4-bit groups for the fused matmul of `names`: the file's own codes, or re-grouped."""
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
        raise ModelLoadError(f"{source.path}: {name} is stored quantized but its blocks cannot be read")
    return tensor


def _fused_bias(source: ModelSource, model: DecoderStage, names: list[str]) -> torch.Tensor | None:
    if not model.config.attention_bias or ".q_proj." not in names[0]:
        return None
    biases = [source.read_tensor(n.replace(".weight", ".bias")) for n in names]
    return torch.from_numpy(np.concatenate(biases))


def _quantize_embedding(
    model: DecoderStage,
    source: ModelSource,
    weights: str,
    device: torch.device,
    dtype: torch.dtype,
    report: FormatReport,
    *,
    head_split_failed: bool = False,
) -> None:
    if model.embed_tokens is None:
        return
    held = embedding_format(source, weights)
    if held is None or _head_shares_table(model, source, weights):
        return  # the head's step looks the table up in its own codes (`SharedTableEmbedding`)
    if not head_split_failed and _split_head_serves_embedding(model, source, weights, device):
        return  # the split head's rows are the table (`SplitHeadEmbedding`): not decoded twice
    if held.from_file:
        table = _stored(source, EMBEDDING)
    else:
        table = quantize_groupwise(source.read_tensor(EMBEDDING), bits=held.bits)
    model.embed_tokens = GroupwiseEmbedding(table, device, dtype)
    report.counts[f"embedding {table.bits}-bit from {table.source_format}"] += 1


def _split_head_serves_embedding(
    model: DecoderStage, source: ModelSource, weights: str, device: torch.device
) -> bool:
    """A stage holding both ends of a tied model whose head is split (`SplitQ8Head`)."""
    return (
        source.config.tie_word_embeddings
        and model.embed_tokens is not None
        and model.lm_head is not None
        and head_is_split(source, weights, device.type)
    )


def _head_shares_table(model: DecoderStage, source: ModelSource, weights: str) -> bool:
    """A stage holding both ends of a tied model whose table stays groupwise and whose head is a
    `GroupwiseLinear` (Q4_K_M's Q6_K table): the embedding is looked up in the head's codes."""
    return (
        source.config.tie_word_embeddings
        and model.embed_tokens is not None
        and model.lm_head is not None
        and embedding_format(source, weights) is not None
        and not head_is_rescored(source, weights)
        and matmul_format(source, [LM_HEAD], weights, is_head=True).held == GROUPWISE
    )


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate every parameter still on the meta device (norms and dense matrices) on `device`."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_meta:
                # not empty_like: an op on a meta tensor imports torch's meta registrations (0.5 s)
                empty = torch.empty(tuple(param.shape), dtype=param.dtype, device=device)
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
