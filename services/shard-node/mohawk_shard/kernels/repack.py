"""A GGUF tensor's blocks straight into the matmul kernels' layouts (`repack_blocks.cpp`), at load.

Design. Decoding a tensor to numpy codes, scales and minimums (`gguf_blocks.py`) and then packing
them (`int4_rows.pack`, `int8_rows.pack`) walked every weight several times in single-threaded
numpy, with a byte-a-weight temporary or two: 20 s of a 1.7B Q4_K_M file's 32 s load on two
cores. Here one compiled pass per tensor reads the file's blocks where the file is mapped, decodes
a row at a time into a thread's scratch and writes the kernel's layout, threads splitting the
column blocks, with the same bits as the numpy path (tests/shard/kernels). The parts of a fused
matmul (q/k/v, gate/up) each fill their own column blocks of one output, so nothing is
concatenated; a part whose rows are not whole column blocks of 16, a table past fp16, or a source
with no mapped blocks returns None, and the caller takes the numpy path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mohawk_common.model_store.quantized import FOUR_BIT_FORMATS, StoredBlocks
from mohawk_shard.kernels import int4_rows, int8_rows, q4k_rows
from mohawk_shard.kernels.huge_pages import huge_empty
from mohawk_shard.kernels.library import kernel

TYPE_CODES = {"Q4_0": 0, "Q4_1": 1, "Q4_K": 2, "Q8_0": 3, "Q5_0": 4, "Q5_1": 5, "Q5_K": 6, "Q6_K": 7}
COLUMN_BLOCK = 16


def _fits(parts: Sequence[StoredBlocks], types: frozenset[str], device: torch.device) -> bool:
    in_features = parts[0].shape[1]
    return (
        device.type == "cpu"
        and kernel() is not None
        and all(p.type_name in types and p.shape[0] % COLUMN_BLOCK == 0 for p in parts)
        and all(p.shape[1] == in_features for p in parts)
    )


def _repack(parts: Sequence[StoredBlocks], layout: int, tables: dict[str, torch.Tensor | None]) -> bool:
    """Each part into its own column blocks of `tables` (codes, scales, mins, subs); False where
    the compiled pass refused one (a table past fp16)."""
    library = kernel()
    if library is None:
        return False
    in_features, first = parts[0].shape[1], 0
    for part in parts:
        blocks = part.shape[0] // COLUMN_BLOCK
        rows = None if part.rows is None else np.ascontiguousarray(part.rows, dtype=np.int64)

        def at(name: str, first: int = first, blocks: int = blocks) -> int | None:
            table = tables[name]
            return None if table is None else table[first : first + blocks].data_ptr()

        status = library.mohawk_repack_blocks(
            part.raw.ctypes.data, part.raw.shape[1], None if rows is None else rows.ctypes.data,
            part.shape[0], in_features, TYPE_CODES[part.type_name], layout,
            at("codes"), at("scales"), at("mins"), at("subs"), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            return False
        first += blocks
    return True


def int4_from_blocks(parts: Sequence[StoredBlocks], device: torch.device) -> int4_rows.PackedInt4 | None:
    """The 4-bit kernel's layout of the fused matmul whose parts are `parts` (Q4_0/Q4_1/Q4_K), or
    None where this path does not apply."""
    if not _fits(parts, FOUR_BIT_FORMATS, device):
        return None
    blocks, in_features = sum(p.shape[0] for p in parts) // COLUMN_BLOCK, parts[0].shape[1]
    codes = huge_empty(blocks, in_features // 8, COLUMN_BLOCK, dtype=torch.int32)
    scales = huge_empty(blocks, in_features // 32, COLUMN_BLOCK, dtype=torch.float16)
    mins = huge_empty(blocks, in_features // 32, COLUMN_BLOCK, dtype=torch.float16)
    if not _repack(parts, 4, {"codes": codes, "scales": scales, "mins": mins, "subs": None}):
        return None
    return int4_rows.PackedInt4(codes, scales, mins, blocks * COLUMN_BLOCK)


def q4k_from_blocks(parts: Sequence[StoredBlocks], device: torch.device) -> q4k_rows.PackedQ4K | None:
    """The Q4_K kernel's layout (`q4k_rows.py`) of a fused matmul whose parts are all Q4_K, or None
    where this path does not apply."""
    if not _fits(parts, frozenset({"Q4_K"}), device) or parts[0].shape[1] % q4k_rows.SUPER_BLOCK != 0:
        return None
    blocks, in_features = sum(p.shape[0] for p in parts) // COLUMN_BLOCK, parts[0].shape[1]
    codes = huge_empty(blocks, in_features // 8, COLUMN_BLOCK, dtype=torch.int32)
    subs = huge_empty(blocks, in_features // 64, 64, dtype=torch.uint8)
    supers = huge_empty(blocks, in_features // q4k_rows.SUPER_BLOCK, 32, dtype=torch.float16)
    if not _repack(parts, 5, {"codes": codes, "scales": supers, "mins": None, "subs": subs}):
        return None
    return q4k_rows.PackedQ4K(codes, subs, supers, blocks * COLUMN_BLOCK)


def int8_from_blocks(parts: Sequence[StoredBlocks], device: torch.device) -> int8_rows.PackedInt8 | None:
    """The 5-to-8-bit kernel's layout of a run of parts stored in one of `int8_rows.FORMATS`, or
    None where this path does not apply."""
    if not _fits(parts, int8_rows.FORMATS, device) or len({p.type_name for p in parts}) != 1:
        return None
    fmt = parts[0].type_name
    blocks, in_features = sum(p.shape[0] for p in parts) // COLUMN_BLOCK, parts[0].shape[1]
    groups = in_features // 32

    def table(width: int, dtype: torch.dtype) -> torch.Tensor:
        return huge_empty(blocks, width, COLUMN_BLOCK, dtype=dtype)

    factored = fmt == "Q6_K"
    codes = table(in_features // 8 + in_features // 16 if factored else in_features // 4, torch.int32)
    scales = table(in_features // 256 if factored else groups, torch.float16)
    mins = table(groups, torch.float16) if fmt in ("Q5_1", "Q5_K") else None
    subs = table(in_features // 16, torch.int8) if factored else None
    if not _repack(parts, 8, {"codes": codes, "scales": scales, "mins": mins, "subs": subs}):
        return None
    return int8_rows.PackedInt8(codes, scales, mins, subs, int8_rows.OFFSETS[fmt], blocks * COLUMN_BLOCK)


def split_q8_from_blocks(
    blocks: StoredBlocks, device: torch.device
) -> tuple[int4_rows.PackedInt4, torch.Tensor, torch.Tensor] | None:
    """A Q8_0 table's split head (`model/split_head.py`) from its blocks: the high nibbles in the
    4-bit kernel's layout, the low nibbles two a byte [N, K/2], and the file's fp16 scales
    [N, K/32]; None where this path does not apply."""
    library = kernel()
    if library is None or not _fits([blocks], frozenset({"Q8_0"}), device):
        return None
    rows_out, in_features = blocks.shape
    column_blocks, groups = rows_out // COLUMN_BLOCK, in_features // 32
    codes = torch.empty(column_blocks, in_features // 8, COLUMN_BLOCK, dtype=torch.int32)
    scales = torch.empty(column_blocks, groups, COLUMN_BLOCK, dtype=torch.float16)
    mins = torch.empty_like(scales)
    low = torch.empty(rows_out, in_features // 2, dtype=torch.uint8)
    d = torch.empty(rows_out, groups, dtype=torch.float16)
    rows = None if blocks.rows is None else np.ascontiguousarray(blocks.rows, dtype=np.int64)
    status = library.mohawk_split_q8_blocks(
        blocks.raw.ctypes.data, blocks.raw.shape[1], None if rows is None else rows.ctypes.data,
        rows_out, in_features, codes.data_ptr(), scales.data_ptr(), mins.data_ptr(), low.data_ptr(),
        d.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        return None
    return int4_rows.PackedInt4(codes, scales, mins, rows_out), low, d
