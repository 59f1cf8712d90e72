"""Layers that run 4- and 8-bit groupwise weights as stored: `Int4Linear` and `GroupwiseEmbedding`.

Design. On CPU, where the compiled kernels build (`kernels/library.py`), `Int4Linear` runs the
row-block kernel of `kernels/int4_rows.py`: fp32 rows in and out (int8 a group of 32 inside, as
llama.cpp's), fp16 scales and minimums, a row's bits independent of the call by construction.
Elsewhere, and what the rest of this paragraph describes, it hands the codes to torch's tinygemm
kernels, which compute
`y = x · ((q − 8) · scale + zero)ᵀ` with one bf16 scale and zero per group of input columns: on
CPU `_weight_int4pack_mm_for_cpu`, on CUDA `_weight_int4pack_mm`, each with its own packing of the
codes. A group `w = scale · code + minimum` is the same weights with `zero = minimum + 8 · scale`.
Printed by `python bench/int4_kernels.py` (torch 2.13, SmolLM2-135M's 30 layers, 1 thread,
distinct weights per layer so they stream from memory as in a real step): 6.3 ms a batch-1 step
against 25.4 ms in fp32; the kernel's fast path takes bf16 activations (fp32 and fp16
activations run about 30x slower), so
activations are cast to bf16 at the kernel and the result back to the caller's dtype. The scales
and zeros are bf16 too, the kernel's only choice: a GGUF scale (fp16) loses 3 mantissa bits there,
an error of at most 1/64 of a quantization step per weight.

The kernel suits a few rows (decode); a CPU with native bf16 matmuls (AVX512-BF16 or AMX) runs
long prompts somewhat faster by unpacking the codes to a bf16 weight for the one call and running
a dense bf16 matmul (nothing dense is kept between calls; `python bench/int4_kernels.py` prints
both). The two give slightly different numbers, and in the default, batch-invariant mode a
sequence's tokens must not depend on which one its rows met, so there every row takes the kernel,
which computes each row alone (bit for bit the same among 1 to 512 rows, at any offset:
`tests/shard/engine/test_native_weights.py`). A rule by row (long prompts' positions dense, the rest on
the kernel) was tried and is not enough: a prefix-cache hit, a session's next turn or a resume
reuses KV that another row class computed. Only with `batch_invariant` off does a step of
`DENSE_MIN_ROWS` rows or more run all its rows dense (`dense_rows`), in one call padded to a
multiple of `DENSE_ROW_MULTIPLE` rows, which bounds the shapes oneDNN compiles a kernel for
(`native_caches.py`). The kernel is within 1.22x of a dense bf16 matmul on weights already
unpacked at 512 rows on this machine's CPU, before the unpacking the dense path pays each call.
`GroupwiseEmbedding` keeps a token table's codes (4-bit ones two a byte, wider ones one a byte) and
dequantizes only the rows a step looks up.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.kernels import int4_rows, q4k_rows
from mohawk_shard.kernels.top_rows import top_indices

KERNEL_DTYPE = torch.bfloat16
DENSE_MIN_ROWS = 96  # batch_invariant off: a step this long runs faster through the unpacked weight
DENSE_ROW_MULTIPLE = 32  # a dense call's rows are padded to a multiple of this


_DENSE_ROWS: ContextVar[int | None] = ContextVar("dense_rows", default=None)


@contextmanager
def dense_rows(num_rows: int | None) -> Iterator[None]:
    """Within the block, `Int4Linear` calls over `num_rows` rows (a step's rows; None: none) run
    the dense bf16 matmul where this CPU has one; calls over other rows run the kernel."""
    token = _DENSE_ROWS.set(num_rows)
    try:
        yield
    finally:
        _DENSE_ROWS.reset(token)


class Int4Linear(nn.Module):
    """y = x·Wᵀ (+ b) with W held as packed 4-bit codes: on CPU, where the compiled kernels run, in
    the row kernel's layout with fp16 scales and minimums (`kernels/int4_rows.py`), else in
    tinygemm's with per-group bf16 scales and zeros (`kernel="tinygemm"` asks for the latter)."""

    packed: torch.Tensor  # tinygemm's packing, or the row kernel's codes (`row_kernel`)
    scales_and_zeros: torch.Tensor  # tinygemm's
    row_scales: torch.Tensor  # the row kernel's
    row_mins: torch.Tensor
    q4k_subs: torch.Tensor  # the Q4_K kernel's (`q4k`)
    q4k_supers: torch.Tensor

    def __init__(
        self,
        weight: GroupQuantized | int4_rows.PackedInt4 | q4k_rows.PackedQ4K,
        device: torch.device,
        bias: torch.Tensor | None = None,
        kernel: str = "auto",
        source_format: str = "int4",
    ) -> None:
        """`weight`: the codes to pack, or a weight already in the row kernel's layout or the Q4_K
        kernel's (the loader's repack from the file's blocks, `kernels/repack.py`), whose format is
        `source_format`."""
        super().__init__()
        on_cpu = device.type == "cpu"
        self.q4k = isinstance(weight, q4k_rows.PackedQ4K)  # the Q4_K kernel's layout (`q4k_rows.py`)
        if isinstance(weight, q4k_rows.PackedQ4K):
            self.out_features, self.in_features = weight.out_features, weight.codes.shape[1] * 8
            self.group_size, self.source_format, self.row_kernel = int4_rows.GROUP_SIZE, source_format, True
            self.register_buffer("packed", weight.codes)
            self.register_buffer("q4k_subs", weight.subs)
            self.register_buffer("q4k_supers", weight.supers)
        elif isinstance(weight, int4_rows.PackedInt4):
            self.out_features, self.in_features = weight.out_features, weight.codes.shape[1] * 8
            self.group_size, self.source_format, self.row_kernel = int4_rows.GROUP_SIZE, source_format, True
            self._hold_rows(weight)
        else:
            self._hold_codes(weight, device, kernel)
        self._matmul = (
            torch.ops.aten._weight_int4pack_mm_for_cpu if on_cpu else torch.ops.aten._weight_int4pack_mm
        )
        self._cpu_block = (
            None if self.row_kernel or not on_cpu else cpu_pack_block(self.out_features, self.in_features)
        )
        self._dense_rows_pay = (
            on_cpu and native_bf16_matmul() and (self.row_kernel or self._cpu_block is not None)
        )
        self.bias = nn.Parameter(bias.to(device), requires_grad=False) if bias is not None else None

    def _hold_codes(self, weight: GroupQuantized, device: torch.device, kernel: str) -> None:
        if weight.bits != 4:
            raise ValueError(f"Int4Linear takes 4-bit codes, got {weight.bits}-bit")
        self.out_features, self.in_features = weight.shape
        self.group_size = weight.group_size
        self.source_format = weight.source_format
        mins = weight.mins if weight.mins is not None else np.zeros_like(weight.scales)
        fits = int4_rows.supports(weight.shape, self.group_size, device)
        self.row_kernel = kernel != "tinygemm" and fits and int4_rows.fits_fp16(weight.scales, mins)
        if self.row_kernel:
            self._hold_rows(int4_rows.pack(weight.codes, weight.scales, mins, device))
        else:
            codes = torch.from_numpy(np.ascontiguousarray(weight.codes))
            scales = torch.from_numpy(weight.scales)
            zeros = torch.from_numpy(mins) + 8.0 * scales
            # the kernels want [groups, N, 2]: per group of inputs, each output's (scale, zero)
            pairs = torch.stack((scales, zeros), dim=-1).transpose(0, 1).contiguous()
            self.register_buffer("scales_and_zeros", pairs.to(device=device, dtype=KERNEL_DTYPE))
            self.register_buffer("packed", pack_int4(codes, device))

    def _hold_rows(self, rows: int4_rows.PackedInt4) -> None:
        self.register_buffer("packed", rows.codes)
        self.register_buffer("row_scales", rows.scales)
        self.register_buffer("row_mins", rows.mins)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        dense = self._dense_rows_pay and _DENSE_ROWS.get() == flat.shape[0]
        if self.row_kernel and not dense and x.dtype == torch.float32 and x.dim() == 2 and self.bias is None:
            return self._rows(x)
        if dense:
            y = self._dense(flat.to(KERNEL_DTYPE))
        elif self.row_kernel:
            y = self._rows(flat.float())
        else:
            # tinygemm wants contiguous rows (a multi-sequence step's attention output is a view)
            rows = flat.to(KERNEL_DTYPE).contiguous()
            y = self._matmul(rows, self.packed, self.group_size, self.scales_and_zeros)
        y = y.to(x.dtype) if x.dim() == 2 else y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """float32 rows through the CPU row kernel that holds this weight."""
        if self.q4k:
            return q4k_rows.matmul(x, self.packed, self.q4k_subs, self.q4k_supers)
        return int4_rows.matmul(x, self.packed, self.row_scales, self.row_mins, self.out_features)

    def _dense(self, rows: torch.Tensor) -> torch.Tensor:
        """bf16 rows through the unpacked weight in one call, padded to a multiple of
        `DENSE_ROW_MULTIPLE` rows."""
        num_rows = rows.shape[0]
        padded = F.pad(rows, (0, 0, 0, -num_rows % DENSE_ROW_MULTIPLE))
        return F.linear(padded, self.dense_weight())[:num_rows]

    def row_codes(self, rows: torch.Tensor) -> torch.Tensor:
        """uint8 codes [n, in] of output rows `rows` (int64 [n]), read back out of the CPU packing."""
        if self.row_kernel:
            return int4_rows.unpack_rows(self.packed, rows)
        if self._cpu_block is None:
            raise RuntimeError("row_codes reads a CPU packing only")
        half = self._cpu_block // 2
        by_block = self.packed.view(-1, self.in_features, half).transpose(1, 2)
        within = rows % self._cpu_block
        packed = by_block[rows // self._cpu_block, within % half]  # [n, in] bytes
        return (packed >> ((within >= half).to(torch.uint8) * 4)[:, None]) & 15

    def dense_weight(self) -> torch.Tensor:
        """The bf16 weight [out, in] the kernel computes with, from the CPU packing."""
        if self.q4k:
            return q4k_rows.dense_weight(self.packed, self.q4k_subs, self.q4k_supers, KERNEL_DTYPE)
        if self.row_kernel:
            return int4_rows.dense_weight(
                self.packed, self.row_scales, self.row_mins, self.out_features, KERNEL_DTYPE
            )
        if self._cpu_block is None:
            raise RuntimeError("dense_weight reads the CPU packing only")
        codes = unpack_int4_cpu(self.packed, self.out_features, self.in_features, self._cpu_block)
        groups = codes.view(self.out_features, -1, self.group_size).to(KERNEL_DTYPE)
        per_output = self.scales_and_zeros.transpose(0, 1)  # [out, groups, 2]
        scale, zero = per_output[..., :1], per_output[..., 1:]
        return groups.sub_(8).mul_(scale).add_(zero).view(self.out_features, self.in_features)

    def extra_repr(self) -> str:
        shape = f"in={self.in_features}, out={self.out_features}, group={self.group_size}"
        return f"{shape} ({self.source_format})"


def _inner_k_tiles(in_features: int) -> int:
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"tinygemm needs input features in multiples of 32, got {in_features}")


def pack_int4(codes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 codes [N, K] in [0, 16) -> the tinygemm layout of `device` (int32 codes accepted)."""
    tiles = _inner_k_tiles(codes.shape[1])
    if device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), tiles)
    pairs = codes.to(torch.uint8)
    packed = (pairs[:, ::2] << 4 | pairs[:, 1::2]).to(device)  # two codes a byte, high nibble first
    return torch.ops.aten._convert_weight_to_int4pack(packed, tiles)


def unpack_int4_cpu(packed: torch.Tensor, out_features: int, in_features: int, block: int) -> torch.Tensor:
    """uint8 codes [N, K] from `_convert_weight_to_int4pack_for_cpu`'s layout: per block of `block`
    outputs, for each input column, `block / 2` bytes whose low nibbles are the block's first half of
    outputs and high nibbles its second half."""
    by_block = packed.view(out_features // block, in_features, block // 2)
    codes = torch.cat((by_block & 15, by_block >> 4), dim=2)  # [N / block, K, block]
    return codes.transpose(1, 2).reshape(out_features, in_features)


def cpu_pack_block(out_features: int, in_features: int) -> int | None:
    """The output block size of this CPU's int4 packing, None when no layout `unpack_int4_cpu`
    knows fits the shape (then the 4-bit kernel runs every call)."""
    block = probed_pack_block(in_features)
    return block if block is not None and out_features % block == 0 else None


@functools.cache
def probed_pack_block(in_features: int) -> int | None:
    """Packs a probe of 128 outputs and finds the block size that unpacks it back."""
    rows = torch.arange(128, dtype=torch.int32)[:, None]
    cols = torch.arange(in_features, dtype=torch.int32)[None, :]
    probe = (rows * 7 + cols * 3 + rows // 16) % 16
    packed = pack_int4(probe, torch.device("cpu"))
    if packed.numel() * 2 != probe.numel():
        return None
    for block in (64, 32, 16):
        if torch.equal(unpack_int4_cpu(packed, 128, in_features, block).to(torch.int32), probe):
            return block
    return None


@functools.cache
def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX), so a dense bf16 matmul pays."""
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


class GroupwiseEmbedding(nn.Module):
    """A token table kept as groupwise codes; looked-up rows are dequantized on the fly."""

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    def __init__(self, table: GroupQuantized, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = table.shape
        self.group_size = table.group_size
        self.dtype = dtype
        self.source_format = table.source_format
        self.packed = table.bits == 4 and table.codes.dtype == np.uint8 and self.embedding_dim % 2 == 0
        codes = table.codes[:, ::2] | table.codes[:, 1::2] << 4 if self.packed else table.codes
        self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(codes)).to(device))
        self.register_buffer("scales", torch.from_numpy(table.scales).to(device))
        mins = torch.from_numpy(table.mins).to(device) if table.mins is not None else None
        self.register_buffer("mins", mins)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.rows(token_ids).to(self.dtype)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32 rows of `token_ids` (any shape) -> [..., embedding_dim]."""
        flat = token_ids.reshape(-1)
        codes = self.codes.index_select(0, flat)
        if self.packed:  # even columns in the low nibbles, odd in the high
            codes = torch.stack((codes & 15, codes >> 4), dim=-1).view(-1, self.embedding_dim)
        codes = codes.float()
        groups = codes.view(-1, self.embedding_dim // self.group_size, self.group_size)
        out = groups * self.scales.index_select(0, flat).unsqueeze(-1)
        if self.mins is not None:
            out = out + self.mins.index_select(0, flat).unsqueeze(-1)
        return out.view(*token_ids.shape, self.embedding_dim)


class RescoredHead(nn.Module):
    """An LM head run 4-bit, whose best `shortlist` logits per row are then recomputed exactly.

    The 4-bit pass ranks the whole vocabulary (1.6 ms a batch-1 step for SmolLM2's 49152 × 576
    head, 1 thread, against 4.8 ms in fp32: `bench/int4_kernels.py`); the shortlist is rescored
    in fp32 from the file's own rows (Q8_0 for SmolLM2), so the tokens greedy decoding and top-k
    sampling pick among carry the file's exact logits. The exact best token misses the shortlist
    only when a row's 64 best logits all lie within the regrouping error of each other.
    """

    def __init__(self, approximate: Int4Linear, exact: GroupwiseEmbedding, shortlist: int = 64) -> None:
        super().__init__()
        self.approximate, self.exact = approximate, exact
        self.shortlist = min(shortlist, approximate.out_features)
        self.source_format = f"{approximate.source_format}, shortlist from {exact.source_format}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.approximate.forward(x).float()
        candidates = top_indices(logits, self.shortlist)  # [M, shortlist]
        rows = self.exact.rows(candidates)  # [M, shortlist, hidden]
        exact = torch.matmul(rows, x.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(-1, candidates, exact)
