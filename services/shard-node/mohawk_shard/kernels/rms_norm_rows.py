"""RMSNorm on CPU in one compiled call (`rms_norm_rows.cpp`, in the library `library.py` builds).

`F.rms_norm` on CPU decomposes into about six ops (square, mean, add, rsqrt, two multiplies), each
dispatched on its own: 61 norms a SmolLM2 decode step. This is one call, each row alone in a fixed
order (batch invariant, as the torch ops are), for fp32 rows and weights.
"""

from __future__ import annotations

import torch

from mohawk_shard.kernels.library import kernel


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and kernel() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N] / sqrt(mean(x²) + eps) · weight [N], fp32 (the op `torch.ops.mohawk.rms_norm_rows`)."""
    return torch.ops.mohawk.rms_norm_rows.default(x, weight, eps)
