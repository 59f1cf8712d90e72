"""What a node's weights cost in memory, for its heartbeat (the coordinator plans from these).

A decoder layer's bytes are measured on the one-layer backend the node builds to time itself
(`Backend.weight_bytes`, node/capacity.py); the embedding and the final norm + LM head are not built
there, so they are computed here from the model's shape and from the formats a torch stage holds
them in, as `weight_formats.py` decides them for the loader: a groupwise token table is
`GroupwiseEmbedding`'s codes and fp32 scales (and minimums), a 4-bit head `Int4Linear`'s packed
codes and bf16 (scale, zero) pairs, a 5-, 6- or 8-bit head (Q4_K_M's Q6_K output)
`GroupwiseLinear`'s int8 codes and fp16 scales (and minimums; Q6_K's codes in 6 bits on CPU), a
rescored head adds its Q8_0 table, and a split head (CPU) is the packed high nibbles, the low
nibbles and fp16 scales, which a tied first stage shares. Pure functions: no array library.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.quantized import GROUP_SIZE, GROUP_SIZES
from mohawk_common.model_store.source import LM_HEAD
from mohawk_shard.model.weight_formats import (
    DENSE,
    GROUPWISE,
    INT4,
    SIGNED_FORMATS,
    MatmulFormat,
    TableFormat,
    embedding_format,
    head_is_rescored,
    head_is_split,
    layer_matmul_formats,
    matmul_format,
    weights_dtype,
)

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SCALE_BYTES = 4  # GroupwiseEmbedding's scales and minimums are float32
_TABLE_BYTES = 2  # GroupwiseLinear's scales and minimums are float16 (where they fit)
_PAIR_BYTES = 4  # Int4Linear's (scale, zero) per group and output: two bf16
_Q8_0_TABLE = TableFormat(bits=8, has_mins=False, from_file=True)
FACTORED_SCALES = {"Q6_K": 256}  # formats `GroupwiseLinear` keeps the stored scale factors of -> super-block


@dataclass(frozen=True, slots=True)
class StageWeightBytes:
    """Bytes of the embedding (stage 0) and of the final norm + LM head (last stage).

    Each is what a stage holding only that end holds. A stage holding both ends of a tied model
    holds `shared` bytes once that both counts include (the one matrix of a dense tied pair, or the
    Q8_0 table a rescored head shares with the embedding): `held` says what a stage holds. The
    heartbeat carries `embedding` and `head` only, so the coordinator counts a single-stage plan
    as `embedding + head`, over by `shared`: on the safe side (31.8 MB for SmolLM2-135M native).
    """

    embedding: int
    head: int
    shared: int = 0

    def held(self, *, embedding: bool, head: bool) -> int:
        """Bytes of the ends a stage holds (`embedding` on stage 0, `head` on the last stage)."""
        both = embedding and head
        return (
            (self.embedding if embedding else 0) + (self.head if head else 0) - (self.shared if both else 0)
        )


def compute_dtype(dtype: str, device: str, weights: str = "native") -> str:
    """The dtype a backend computes in for the settings' `dtype`: auto is bf16 under `bf16`
    weights, fp32 under `fp32`, and otherwise bf16 on CUDA and fp32 elsewhere."""
    dtype = weights_dtype(weights, dtype)
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def stage_weight_bytes(
    source: ModelSource, weights: str, dtype: str, device: str = "cpu"
) -> StageWeightBytes:
    """Embedding and head bytes as a torch stage on `device` ("cpu", "cuda:0") with weight mode
    `weights` and compute dtype `dtype` (resolved, e.g. "float32") holds them; the head includes
    the final norm."""
    config = source.config
    element = ELEMENT_BYTES.get(dtype, 4)
    rows, columns = config.vocab_size, config.hidden_size
    dense = rows * columns * element
    table = embedding_format(source, weights)
    embedding = dense if table is None else groupwise_table_bytes(table, rows, columns)
    held = matmul_format(source, [LM_HEAD], weights, is_head=True)
    head = columns * element + matmul_bytes(held, [rows], columns, element, device.split(":")[0])
    shared = 0
    if head_is_split(source, weights, device.split(":")[0]):
        head = columns * element + split_head_bytes(rows, columns)
        shared = embedding if config.tie_word_embeddings else 0
    elif head_is_rescored(source, weights):
        exact = groupwise_table_bytes(_Q8_0_TABLE, rows, columns)
        head += exact
        shared = exact if config.tie_word_embeddings else 0
    elif config.tie_word_embeddings and table is not None and held.held == GROUPWISE:
        shared = embedding  # `SharedTableEmbedding`: the table is the head's codes
    elif config.tie_word_embeddings and table is None and held.held == DENSE:
        shared = dense  # the stage's embedding and head are one parameter
    return StageWeightBytes(embedding=embedding, head=head, shared=shared)


def matmul_bytes(
    held: MatmulFormat, part_rows: list[int], columns: int, element: int, device: str = "cpu"
) -> int:
    """Bytes of a (fused) matmul held as `held` decides, its parts [`part_rows`[i], `columns`]:
    one `Int4Linear`, `GroupwiseLinear` or dense matrix, or a `ConcatLinear` of one per run, on a
    torch stage on `device` ("cpu" or "cuda")."""
    if held.is_int4:
        return _int4_run_bytes(held.stored, sum(part_rows), columns, device)
    if held.held == DENSE:
        return sum(part_rows) * columns * element
    total = 0
    for kind, indices in held.runs:
        rows = sum(part_rows[i] for i in indices)
        stored = held.stored[indices[0]]
        if kind == GROUPWISE and stored in FACTORED_SCALES:
            six_bits = device == "cpu"  # the CPU kernel's layout (kernels/int8_rows.py), else a byte a code
            total += factored_matmul_bytes(
                rows, columns, GROUP_SIZES[stored], FACTORED_SCALES[stored], six_bits
            )
        elif kind == GROUPWISE:
            has_mins = stored not in SIGNED_FORMATS
            total += groupwise_matmul_bytes(rows, columns, GROUP_SIZES[stored], has_mins=has_mins)
        else:
            total += _int4_run_bytes([held.stored[i] for i in indices], rows, columns, device)
    return total


def _int4_run_bytes(stored: Sequence[str], rows: int, columns: int, device: str) -> int:
    """A run held 4-bit: all Q4_K on the CPU, the Q4_K kernel's layout (`kernels/q4k_rows.py`),
    else the group-scaled one."""
    if device == "cpu" and all(s == "Q4_K" for s in stored) and columns % 256 == 0:
        return q4k_matmul_bytes(rows, columns)
    return int4_matmul_bytes(rows, columns)


def q4k_matmul_bytes(rows: int, columns: int) -> int:
    """The Q4_K kernel's layout: 4-bit codes, a 6-bit scale and minimum a byte each a group of 32,
    fp16 d and dmin a super-block of 256 (0.578 bytes a weight)."""
    return rows * columns // 2 + rows * (columns // 32) * 2 + rows * (columns // 256) * 4


def groupwise_table_bytes(table: TableFormat, rows: int, columns: int) -> int:
    """`GroupwiseEmbedding`: 4-bit codes two a byte, wider ones one a byte (int8 or uint8), fp32
    scales (and minimums) per group."""
    codes = rows * columns // 2 if table.bits == 4 and table.has_mins and columns % 2 == 0 else rows * columns
    groups = rows * (columns // table.group_size)
    return codes + groups * _SCALE_BYTES * (2 if table.has_mins else 1)


def factored_matmul_bytes(rows: int, columns: int, group_size: int, super_block: int, six_bits: bool) -> int:
    """`GroupwiseLinear` over Q6_K: its codes in 6 bits (the CPU kernel's layout, `six_bits`) or a
    byte each, an int8 scale a group, an fp16 a super-block."""
    codes = rows * columns * 3 // 4 if six_bits else rows * columns
    return codes + rows * (columns // group_size) + rows * (columns // super_block) * 2


def groupwise_matmul_bytes(rows: int, columns: int, group_size: int, *, has_mins: bool) -> int:
    """`GroupwiseLinear`: a byte a code, fp16 scales (and minimums) per group."""
    groups = rows * (columns // group_size)
    return rows * columns + groups * _TABLE_BYTES * (2 if has_mins else 1)


def split_head_bytes(rows: int, columns: int) -> int:
    """`SplitQ8Head`: the high nibbles as an `Int4Linear`, the low nibbles two a byte, fp16 scales."""
    return int4_matmul_bytes(rows, columns) + rows * columns // 2 + rows * (columns // GROUP_SIZE) * 2


def int4_matmul_bytes(rows: int, columns: int) -> int:
    """`Int4Linear` [rows, columns]: two codes a byte, a bf16 (scale, zero) pair per group and row."""
    return rows * columns // 2 + rows * (columns // GROUP_SIZE) * _PAIR_BYTES


def weights_format(source: ModelSource, weights: str, dtype: str) -> str:
    """The format most of a torch stage's decoder matmuls are held in, for operators:
    `int4 (Q4_1)` for a file's own 4-bit codes, `int4 (regrouped from F32)`, `int8 groupwise from
    Q6_K`, `int4 from Q4_K + int8 groupwise from Q6_K` (a split fused matmul), or the compute dtype."""
    counts: Counter[str] = Counter()
    for layer in range(source.config.num_layers):
        for held in layer_matmul_formats(source, layer, weights).values():
            stored = "+".join(sorted(set(held.stored)))
            if not held.is_quantized:
                counts[dtype] += 1
            elif held.held == INT4:
                counts[f"int4 ({stored})"] += 1
            elif held.is_int4:
                counts[f"int4 (regrouped from {stored})"] += 1
            else:
                counts[held.label] += 1
    return counts.most_common(1)[0][0] if counts else dtype
