"""GGUF's 5-, 6- and 8-bit codes multiplied on a GPU as held, without a dense copy: a Triton kernel.

Design. `GroupwiseLinear` holds a Q5_0, Q5_1, Q5_K, Q6_K or Q8_0 tensor as int8 codes (a byte a
weight) with per-group scales (and minimums), or for Q6_K the file's own int8 scale per 16 and fp16
scale per 256. Its torch path unpacks 16M weights at a time to bf16 and multiplies them: on a GPU
that is the whole matrix of most layers written and read again every call (an H200, torch 2.11,
`bench/kquant_cuda.py`, GPU time from graph replays: a 5632 × 2048 Q6_K call took 0.093 ms at batch
1 against 0.007 ms dense bf16). Here one kernel does a tiled matmul whose weight tile is made in
registers: each program owns a tile of activation rows and output columns, and for each slice of the
inputs loads the codes (int8), their group scales (and minimums, or Q6_K's two factors), forms
`scale · code + minimum` in fp32, rounds it once to the activations' dtype and hands it to `tl.dot`
with an fp32 accumulator. The weights stay 1.07-1.25 bytes each in memory and are read once per tile
of rows. The tile sizes are fixed, never chosen by the number of rows, and the K slices are summed
in one order without splitting K: every output element is reduced in the same order whatever the
batch, so up to `MAX_ROWS` rows the kernel is batch invariant by construction. It is a decode
kernel: past `MAX_ROWS` rows (prompt chunks, big batches) unpacking into cuBLAS is faster, as
llama.cpp's CUDA backend also switches from its vector kernels to dequantize-and-GEMM, so a CUDA
step mixing a long prompt chunk with decoders is not invariant (nor is cuBLAS or tinygemm). Measured
on an H200 (torch 2.11, Triton 3.6, `bench/kquant_cuda.py`, GPU time a call from graph replays, 5632
× 2048): at 1 row Q6_K 0.051 ms against 0.093 unpacked, Q8_0 0.047 against 0.083; still 7x dense
bf16's 0.007 ms and tinygemm Q4_K's 0.006, so the kernel is far from the memory's speed yet (1 to 4
pipeline stages changed it by under 10%). Used for bf16 and fp16 activations on CUDA where Triton
imports; fp32 activations keep the unpacking path (tl.dot would round them to tf32).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class Tiles:
    """A launch's tile: activation rows and output columns a program owns, inputs a step (a
    multiple of every group, 16 and 32, and a divisor of Q6_K's 256), warps and pipeline stages."""

    rows: int
    cols: int
    depth: int
    warps: int = 4
    stages: int = 3


# 16 columns a program, so a batch-1 call spreads over the GPU
DECODE = Tiles(16, 16, 128)
# rows up to which the kernel beats unpacking (H200, torch 2.11, `bench/kquant_cuda.py`, GPU time
# of a 5632 x 2048 call from graph replays): Q6_K 0.051 against 0.093 ms at 1 and 8 rows, even at
# 32 (0.097, 0.096), behind at 64 (0.173)
MAX_ROWS = 16
DTYPES = (torch.bfloat16, torch.float16)


@cache
def available() -> bool:
    """Whether Triton imports (it ships with torch's CUDA wheels, not its CPU ones)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def groupwise_matmul(
        x_ptr,
        codes_ptr,
        scales_ptr,
        mins_ptr,
        supers_ptr,
        out_ptr,
        M,
        N,
        K,
        GROUP: tl.constexpr,
        SUPER: tl.constexpr,
        HAS_MINS: tl.constexpr,
        FACTORED: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        groups = K // GROUP
        accumulator = tl.zeros((BM, BN), dtype=tl.float32)
        for first in range(0, K, BK):
            ks = first + tl.arange(0, BK)
            inside = ks < K
            x = tl.load(
                x_ptr + rows[:, None] * K + ks[None, :],
                mask=(rows[:, None] < M) & inside[None, :],
                other=0.0,
            )
            weight_mask = (cols[:, None] < N) & inside[None, :]
            codes = tl.load(codes_ptr + cols[:, None] * K + ks[None, :], mask=weight_mask, other=0)
            group = cols[:, None] * groups + ks[None, :] // GROUP
            scale = tl.load(scales_ptr + group, mask=weight_mask, other=0).to(tl.float32)
            if FACTORED:  # Q6_K: int8 scale a group times fp16 scale a super-block
                supers = cols[:, None] * (K // SUPER) + ks[None, :] // SUPER
                scale = scale * tl.load(supers_ptr + supers, mask=weight_mask, other=0).to(tl.float32)
            weight = codes.to(tl.float32) * scale
            if HAS_MINS:
                weight += tl.load(mins_ptr + group, mask=weight_mask, other=0).to(tl.float32)
            accumulator = tl.dot(x, tl.trans(weight.to(x.dtype)), accumulator)
        out = out_ptr + rows[:, None] * N + cols[None, :]
        tl.store(
            out, accumulator.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N)
        )

    return groupwise_matmul


def groupwise_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    mins: torch.Tensor | None = None,
    super_scales: torch.Tensor | None = None,
    super_block: int = 256,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16, CUDA) times the weight [N, K] = `scales` · `codes` (+ `mins`) per group of
    `group_size` inputs -> [M, N] in x's dtype. With `super_scales` [N, K / super_block] (Q6_K),
    `scales` are the int8 factors per group and each group's scale is their product."""
    if x.dtype not in DTYPES or x.device.type != "cuda":
        raise ValueError(f"groupwise_matmul takes bf16 or fp16 CUDA activations, not {x.dtype} on {x.device}")
    x = x.contiguous()
    (m, k), n = x.shape, codes.shape[0]
    tiles = DECODE  # any number of rows, but past MAX_ROWS unpacking is faster (`GroupwiseLinear`)
    if codes.shape[1] != k or k % group_size or tiles.depth % group_size:
        raise ValueError(f"codes {tuple(codes.shape)} and groups of {group_size} do not fit inputs of {k}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (-(-m // tiles.rows), -(-n // tiles.cols))
    _kernel()[grid](
        x,
        codes,
        scales,
        scales if mins is None else mins,
        scales if super_scales is None else super_scales,
        out,
        m,
        n,
        k,
        GROUP=group_size,
        SUPER=super_block,
        HAS_MINS=mins is not None,
        FACTORED=super_scales is not None,
        BM=tiles.rows,
        BN=tiles.cols,
        BK=tiles.depth,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return out
