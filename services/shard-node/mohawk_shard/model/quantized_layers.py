"""Layers that run 4- and 8-bit groupwise weights as stored: `Int4Linear` and `GroupwiseEmbedding`.

Design. `Int4Linear` hands the codes to torch's tinygemm kernels, which compute
`y = x · ((q − 8) · scale + zero)ᵀ` with one bf16 scale and zero per group of input columns: on
CPU `_weight_int4pack_mm_for_cpu`, on CUDA `_weight_int4pack_mm`, each with its own packing of the
codes. A group `w = scale · code + minimum` is the same weights with `zero = minimum + 8 · scale`.
Printed by `python bench/int4_kernels.py` (torch 2.13, SmolLM2-135M's 30 layers, 1 thread,
distinct weights per layer so they stream from memory as in a real step): 6.3 ms a batch-1 step
against 25.4 ms in fp32; the kernel's fast path takes bf16 activations (fp32 and fp16
activations run about 30x slower), so
activations are cast to bf16 at the kernel and the result back to the caller's dtype. The scales
and zeros are bf16 too, the kernel's only choice: a GGUF scale (fp16) loses 3 mantissa bits there,
an error of at most 1/64 of a quantization step per weight. `GroupwiseEmbedding` keeps a token
table's codes (int8 for Q8_0, uint8 for 4-bit) and dequantizes only the rows a step looks up.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mohawk_common.model_store.quantized import GroupQuantized

KERNEL_DTYPE = torch.bfloat16


class Int4Linear(nn.Module):
    """y = x·Wᵀ (+ b) with W held as packed 4-bit codes and per-group bf16 scales and zeros."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(self, weight: GroupQuantized, device: torch.device, bias: torch.Tensor | None = None):
        super().__init__()
        if weight.bits != 4:
            raise ValueError(f"Int4Linear takes 4-bit codes, got {weight.bits}-bit")
        self.out_features, self.in_features = weight.shape
        self.group_size = weight.group_size
        self.source_format = weight.source_format
        codes = torch.from_numpy(np.ascontiguousarray(weight.codes))
        scales = torch.from_numpy(weight.scales)
        mins = torch.from_numpy(weight.mins) if weight.mins is not None else torch.zeros_like(scales)
        zeros = mins + 8.0 * scales
        # the kernels want [groups, N, 2]: per group of inputs, each output's (scale, zero)
        pairs = torch.stack((scales, zeros), dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", pairs.to(device=device, dtype=KERNEL_DTYPE))
        self.register_buffer("packed", pack_int4(codes, device))
        on_cpu = device.type == "cpu"
        self._matmul = (
            torch.ops.aten._weight_int4pack_mm_for_cpu if on_cpu else torch.ops.aten._weight_int4pack_mm
        )
        self.bias = nn.Parameter(bias.to(device), requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        y = self._matmul(flat.to(KERNEL_DTYPE), self.packed, self.group_size, self.scales_and_zeros)
        y = y.to(x.dtype) if x.dim() == 2 else y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        shape = f"in={self.in_features}, out={self.out_features}, group={self.group_size}"
        return f"{shape} ({self.source_format})"


def _inner_k_tiles(in_features: int) -> int:
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"tinygemm needs input features in multiples of 32, got {in_features}")


def pack_int4(codes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 codes [N, K] in [0, 16) -> the tinygemm layout of `device`."""
    tiles = _inner_k_tiles(codes.shape[1])
    if device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), tiles)
    pairs = codes.to(torch.uint8)
    packed = (pairs[:, ::2] << 4 | pairs[:, 1::2]).to(device)  # two codes a byte, high nibble first
    return torch.ops.aten._convert_weight_to_int4pack(packed, tiles)


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
        self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(table.codes)).to(device))
        self.register_buffer("scales", torch.from_numpy(table.scales).to(device))
        mins = torch.from_numpy(table.mins).to(device) if table.mins is not None else None
        self.register_buffer("mins", mins)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.rows(token_ids).to(self.dtype)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32 rows of `token_ids` (any shape) -> [..., embedding_dim]."""
        flat = token_ids.reshape(-1)
        codes = self.codes.index_select(0, flat).float()
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
        candidates = logits.topk(self.shortlist, dim=-1).indices  # [M, shortlist]
        rows = self.exact.rows(candidates)  # [M, shortlist, hidden]
        exact = torch.matmul(rows, x.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(-1, candidates, exact)
