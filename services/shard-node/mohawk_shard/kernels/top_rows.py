"""An LM head's shortlist: the indices of each row's k largest logits (`top_rows.cpp`, in the
library `library.py` builds, as the op `torch.ops.mohawk.top_rows`).

A rescored head ranks the whole vocabulary by its fast 4-bit pass and recomputes only the best k
exactly (`split_head.py`, `quantized_layers.RescoredHead`). torch.topk over a 49,152-wide row cost
about 5% of a decode step; the kernel reads the row once against the worst value kept so far. Ties
go to the lower index, so a row's shortlist is one set whatever else its call holds; where the
kernels do not build, torch.topk picks it (the same set barring ties at its edge).
"""

from __future__ import annotations

import torch

from mohawk_shard.kernels.library import kernel


def top_indices(logits: torch.Tensor, k: int) -> torch.Tensor:
    """int64 [M, k]: the indices of each row of `logits` [M, V]'s k largest values, best first."""
    on_cpu = logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
    if on_cpu and kernel() is not None:
        return torch.ops.mohawk.top_rows.default(logits, k)
    return logits.topk(k, dim=-1).indices
