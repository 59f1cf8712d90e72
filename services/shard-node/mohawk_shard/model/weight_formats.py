"""Which format a torch stage holds each matmul and token table in, decided from the file alone.

Design. The torch loader (`weight_loading.py`) builds what these functions decide, and the
heartbeat's byte counts (`footprint.py`) are computed from the same decisions, so the bytes a node
reports cannot drift from the bytes it holds. A decision needs only `source.stored_format` and the
model's shape: no tensor is read and no array library is imported. The rules, per weight mode:
`native` holds each part of a matmul in the file's own codes: Q4_0/Q4_1/Q4_K as 4-bit codes
(`int4`, `Int4Linear`), Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 as int8 codes with the file's group scales
(`int8 groupwise`, `GroupwiseLinear`), never fewer bits than the file stores; it re-groups a Q8_0
LM head to 4 bits (kept exact on a shortlist by the Q8_0 table, `RescoredHead`), and keeps float
tensors dense. A fused matmul whose parts differ in how they are held (q/k Q4_K, v Q6_K, as
Q4_K_M files do) is split (`ConcatLinear`): each run of consecutive parts held alike is one
module, so every part keeps its own format's bytes (holding all at the widest would cost Q4_K parts
1.25 instead of 0.625 bytes a weight); a fused matmul with a float part stays dense whole. A
MoE expert's gate/up and down are matmuls like any other (`layer_matmuls`), decided by the same
rules from the expert's rows of the file's 3-D tensor.
`int4` runs every matmul 4-bit, re-grouping what the file stores otherwise (a choice the operator
makes); `bf16`/`fp32` keep everything dense. A token table stored in any decodable format stays
groupwise under `native` and `int4`, and `int4` re-groups a float one to 8 bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

from mohawk_common.errors import ConfigError
from mohawk_common.model_store import ModelConfig, ModelSource
from mohawk_common.model_store.quantized import DECODABLE_FORMATS, FOUR_BIT_FORMATS, GROUP_SIZE, GROUP_SIZES
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD, expected_shape
from mohawk_shard.config import WeightsMode

WEIGHT_MODES: tuple[str, ...] = get_args(WeightsMode)
QUANTIZING_MODES = ("native", "int4")
_MODE_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # weight modes that fix the compute dtype
FLOAT_FORMATS = frozenset({"F32", "F16", "BF16", "F64"})
GROUPWISE_TABLES = DECODABLE_FORMATS
SIGNED_FORMATS = frozenset({"Q8_0", "Q5_0", "Q6_K"})  # decoded with signed codes and no minimums
# module path inside a decoder layer -> the canonical tensors fused into it
LAYER_MATMULS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}
INT4, REGROUPED, GROUPWISE, DENSE = "int4", "int4 regrouped", "int8 groupwise", "dense"
SPLIT = "split"  # a fused matmul whose parts are held differently: see `MatmulFormat.runs`


@dataclass(frozen=True, slots=True)
class MatmulFormat:
    """How one (fused) matmul is held: `int4` from the file's own 4-bit codes, `int4 regrouped`
    from other weights, `int8 groupwise` from the file's 5-, 6- or 8-bit codes, `split` when its
    parts are held differently (`parts_held`, one entry a part), or `dense` in the compute dtype.
    `fallback` says why a tensor stored quantized stays dense (the loader logs it)."""

    held: str
    stored: tuple[str, ...]
    fallback: str | None = None
    parts_held: tuple[str, ...] = ()

    @property
    def is_int4(self) -> bool:
        return self.held in (INT4, REGROUPED)

    @property
    def is_quantized(self) -> bool:
        return self.held != DENSE

    @property
    def runs(self) -> list[tuple[str, list[int]]]:
        """Consecutive parts held alike (int8 groupwise parts: of one stored format, so codes,
        bits and groups agree): (held, part indices) each; one module a run."""
        runs: list[tuple[str, list[int]]] = []
        previous: tuple[str, str] | None = None
        for index, (held, stored) in enumerate(zip(self.parts_held, self.stored, strict=True)):
            key = (held, stored if held == GROUPWISE else "")
            if key != previous:
                runs.append((held, []))
                previous = key
            runs[-1][1].append(index)
        return runs

    @property
    def label(self) -> str:
        """`int4 from Q4_1`, `int4 regrouped from F32`, `int8 groupwise from Q6_K`, `int4 from Q4_K
        + int8 groupwise from Q6_K` or `dense`: what the stage's report counts."""
        if self.held == DENSE:
            return DENSE
        if self.is_int4:  # one Int4Linear, whatever each part's codes came from
            return f"{self.held} from {'+'.join(sorted(set(self.stored)))}"
        labels = []
        for held, indices in self.runs:
            label = f"{held} from {'+'.join(sorted({self.stored[i] for i in indices}))}"
            if label not in labels:
                labels.append(label)
        return " + ".join(labels)


@dataclass(frozen=True, slots=True)
class TableFormat:
    """A token table held groupwise (`GroupwiseEmbedding`): `bits`-bit codes, fp32 scales and, when
    `has_mins`, fp32 minimums per group of `group_size`; `from_file` when the codes are the file's."""

    bits: int
    has_mins: bool
    from_file: bool
    group_size: int = GROUP_SIZE


def weights_dtype(weights: str, dtype: str) -> str:
    """The settings' `dtype` with `auto` resolved where the weight mode fixes it (`bf16` weights
    compute in bfloat16, `fp32` in float32); still `auto` otherwise, for the backend to resolve.
    Raises ConfigError for an unknown weight mode."""
    if weights not in WEIGHT_MODES:
        raise ConfigError(f"weights {weights!r} is not one of {', '.join(WEIGHT_MODES)}")
    return _MODE_DTYPES.get(weights, dtype) if dtype == "auto" else dtype


def matmul_format(source: ModelSource, names: Sequence[str], weights: str, *, is_head: bool) -> MatmulFormat:
    """How the matmul fusing the canonical tensors `names` is held under weight mode `weights`."""
    formats = tuple(source.stored_format(n) for n in names)
    if weights not in QUANTIZING_MODES:
        return MatmulFormat(DENSE, formats)
    in_features = expected_shape(source.config, names[0])[1]
    if in_features % GROUP_SIZE:
        reason = f"{names[0]}: {in_features} inputs are not whole groups of {GROUP_SIZE}"
        return MatmulFormat(DENSE, formats, reason)
    if all(f in FOUR_BIT_FORMATS for f in formats):
        return MatmulFormat(INT4, formats, parts_held=(INT4,) * len(formats))
    if weights == "int4" or (is_head and set(formats) == {"Q8_0"}):
        parts = tuple(INT4 if f in FOUR_BIT_FORMATS else REGROUPED for f in formats)
        return MatmulFormat(REGROUPED, formats, parts_held=parts)
    if all(f in DECODABLE_FORMATS for f in formats):
        parts = tuple(INT4 if f in FOUR_BIT_FORMATS else GROUPWISE for f in formats)
        held = parts[0] if len(set(parts)) == 1 else SPLIT
        return MatmulFormat(held, formats, parts_held=parts)
    if any(f not in FLOAT_FORMATS for f in formats):
        return MatmulFormat(DENSE, formats, f"{', '.join(names)} stored as {'/'.join(formats)}")
    return MatmulFormat(DENSE, formats)


def layer_matmuls(config: ModelConfig, layer: int) -> dict[str, tuple[str, ...]]:
    """Every matmul of decoder layer `layer`, by module path inside the layer -> the canonical
    tensors fused into it: `LAYER_MATMULS`, where a MoE layer has each expert's gate/up and down
    (`mlp.experts.E.gate_up_proj`, `moe.py`) in place of the dense MLP's. A MoE router (a few rows)
    is no matmul here: it stays dense."""
    if not config.is_moe_layer(layer):
        return LAYER_MATMULS
    matmuls = {path: parts for path, parts in LAYER_MATMULS.items() if not path.startswith("mlp.")}
    for expert in range(config.num_experts):
        prefix = f"mlp.experts.{expert}."
        matmuls[prefix + "gate_up_proj"] = (prefix + "gate_proj", prefix + "up_proj")
        matmuls[prefix + "down_proj"] = (prefix + "down_proj",)
    return matmuls


def layer_matmul_formats(source: ModelSource, layer: int, weights: str) -> dict[str, MatmulFormat]:
    """Each fused matmul of decoder layer `layer`, by its module path inside the layer."""
    return {
        path: matmul_format(source, [f"layers.{layer}.{p}.weight" for p in parts], weights, is_head=False)
        for path, parts in layer_matmuls(source.config, layer).items()
    }


def embedding_format(source: ModelSource, weights: str) -> TableFormat | None:
    """The token table's groupwise form, or None when it is held dense in the compute dtype."""
    if weights not in QUANTIZING_MODES:
        return None
    stored = source.stored_format(EMBEDDING)
    if stored in GROUPWISE_TABLES:
        bits = 8 if stored == "Q8_0" else 4 if stored in FOUR_BIT_FORMATS else 6 if stored == "Q6_K" else 5
        has_mins = stored not in SIGNED_FORMATS
        return TableFormat(bits, has_mins, from_file=True, group_size=GROUP_SIZES[stored])
    if weights == "int4":
        return TableFormat(bits=8, has_mins=True, from_file=False)
    return None


def head_is_rescored(source: ModelSource, weights: str) -> bool:
    """A 4-bit LM head whose shortlist is rescored from the file's Q8_0 rows: `SplitQ8Head` on CPU
    (`head_is_split`), `RescoredHead` elsewhere."""
    return (
        weights == "native"
        and source.stored_format(LM_HEAD) == "Q8_0"
        and matmul_format(source, [LM_HEAD], weights, is_head=True).is_int4
    )


def head_is_split(source: ModelSource, weights: str, device: str) -> bool:
    """A rescored head held once, as its Q8_0 codes' nibbles (`SplitQ8Head`): on CPU, whose int4
    packing it reads back (the loader falls back to `RescoredHead`, and says so, on a CPU whose
    packing layout it does not know)."""
    return head_is_rescored(source, weights) and device == "cpu"
