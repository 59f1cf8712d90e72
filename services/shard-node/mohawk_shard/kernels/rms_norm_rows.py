"""RMSNorm on CPU in one compiled call (`rms_norm_rows.cpp`, in the library `library.py` builds).

`F.rms_norm` on CPU decomposes into about six ops (square, mean, add, rsqrt, two multiplies), each
dispatched on its own: 61 norms a SmolLM2 decode step. This is one call, each row alone in a fixed
order (batch invariant, as the torch ops are), for fp32 rows and weights.
"""

from __future__ import annotations

import torch

from mohawk_shard.kernels.library import kernel, register, require


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and kernel() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N] / sqrt(mean(x²) + eps) · weight [N], fp32."""
    return _traceable(x, weight, eps)


def _run(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    library = require()
    rows = x.contiguous()
    if weight.shape != (rows.shape[-1],) or not weight.is_contiguous():
        raise ValueError(f"rms_norm_rows: weight {tuple(weight.shape)} for rows of {rows.shape[-1]}")
    out = torch.empty_like(rows)
    num_rows = rows.numel() // max(rows.shape[-1], 1)
    if num_rows == 0:
        return out
    library.mohawk_rms_norm_rows(
        rows.data_ptr(),
        num_rows,
        rows.shape[-1],
        weight.data_ptr(),
        eps,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out


_traceable = register("rms_norm_rows(Tensor x, Tensor weight, float eps) -> Tensor", _run)
