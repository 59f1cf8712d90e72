"""`Linear`: y = x·Wᵀ + b, keeping W in whichever layout the device multiplies fastest.

Measured on this project's 2-core Xeon (torch 2.13, 2 threads, SmolLM2-135M shapes, batch 1):
the 30 layers' matmuls take 26.9 ms with `F.linear` on a [out, in] fp32 weight and 22.5 ms as
`x @ Wt` on the same weight stored transposed [in, out] and contiguous; the 49152-row LM head
8.3 ms against 4.5 ms. bf16 (AMX) is the other way round (12.1 vs 15.4 ms), and CUDA prefers
`F.linear`. So fp32 weights on CPU are stored transposed once, after loading.

On CPU a call of 2 to 11 rows is padded to a multiple of four (`invariant_rows`): MKL's AVX2 sgemm
(a 2-core AMD EPYC) computes rows in tiles of four, and in a call of fewer than 12 rows the rows
past the last whole tile take another kernel that reduces differently, so a chunk's sixth row got
other bits than the same row inside a longer prefill and a sequence's text changed with its
chunking. One row alone is left to its own kernel (a gemv), which on that CPU also differs from a
taller call's: padding it to four rows made a batch-1 decode's matmuls 3 to 6 times slower there
(the 49152-row LM head 59 ms against 10), so a dense model's lone decode row is the one case this
does not make invariant on AVX2; the native 4-bit layers (tinygemm) compute every row alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.transposed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else 0
        padded = invariant_rows(rows) if x.is_cpu else rows
        if padded != rows:
            return self.forward(F.pad(x, (0, 0, 0, padded - rows)))[:rows]
        if not self.transposed:
            return F.linear(x, self.weight, self.bias)
        y = torch.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias

    def store_transposed(self) -> None:
        """Keep the weight as a contiguous [in, out] matrix and multiply x @ W from now on."""
        if not self.transposed:
            self.weight = nn.Parameter(self.weight.t().contiguous(), requires_grad=False)
            self.transposed = True


INVARIANT_ROW_TILE = 4  # MKL's AVX2 sgemm: rows in tiles of 4 ...
INVARIANT_ALL_ROWS = 12  # ... and from 12 rows on every row the same whatever the count


def invariant_rows(num_rows: int) -> int:
    """Rows a CPU gemm of two rows or more is run with so that each row's bits do not depend on how
    many there are: `num_rows` from 12 up, else the next multiple of 4; one row stays one."""
    if num_rows <= 1 or num_rows >= INVARIANT_ALL_ROWS:
        return num_rows
    return -(-num_rows // INVARIANT_ROW_TILE) * INVARIANT_ROW_TILE


def prefers_transposed(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32
