"""One layer's KV cache and its int8 store: the tensors attention reads and writes, and how a block
of them is quantized and dequantized. A leaf: it imports torch and nothing of Mohawk, so
`attention.py` and the tier bookkeeping (`kv_quant.py`) both build on it without importing each other.

Design. The cache is head-major, K and V [kv_heads, slots, head_dim], so a gathered context is
the batched matmuls' layout as it lies (`attention.py`). It is stored in the compute dtype, except
that an fp32 stage (a CPU's) stores fp16 by default, as llama.cpp does: half the bytes a decode
step reads and twice the tokens a KV budget holds, widened exactly wherever it is read. A prompt's
own keys are rounded to the stored form before it attends to them, so a query sees the same keys
whether its prompt ran in one step, in chunks or after a prefix hit (`kv_cache_dtype="float32"`
keeps fp32). With an int8 tier every
block also has an int8 home, [slots, kv_heads, head_dim] with one fp32 scale per block and KV head:
absmax per block and head, symmetric, `INT8_LEVELS` levels each side of zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT8_LEVELS = 127.0


def kv_storage_dtype(kv_cache_dtype: str, compute: torch.dtype) -> torch.dtype:
    """The dtype a cache (or an int8 cache's recent tier) is stored in: `kv_cache_dtype` float32
    keeps fp32; otherwise fp16 for an fp32 stage and the compute dtype for any other."""
    if kv_cache_dtype == "float32":
        return torch.float32
    return torch.float16 if compute == torch.float32 else compute


@dataclass(slots=True)
class Int8Store:
    """The int8 home of every block of one layer, for K or V."""

    data: torch.Tensor  # int8 [num_blocks × block_size, kv_heads, dim] (the hot pool is head-major)
    scale: torch.Tensor  # fp32 [num_blocks, kv_heads]


@dataclass(slots=True)
class KVCache:
    """One layer's cache: K and V [kv_heads, slots, head_dim] as stored (`kv_storage_dtype`), and
    their int8 homes in two-tier mode."""

    key: torch.Tensor
    value: torch.Tensor
    key_int8: Int8Store | None = None
    value_int8: Int8Store | None = None
    group: int = 0  # the KV group whose block table the layer reads (the stage shares its tensors)


def quantize_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, block_size, kv_heads, dim] -> (int8 of the same shape, fp32 scales [n, kv_heads])."""
    scale = blocks.abs().amax(dim=(1, 3)).float() / INT8_LEVELS
    safe = scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None, :, None]
    quantized = torch.round(blocks.float() / safe).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return quantized, scale


def dequantize(quantized: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., kv_heads, dim] times fp32 scales [..., kv_heads] -> `dtype`."""
    return (quantized.float() * scale.unsqueeze(-1)).to(dtype)
