"""Fixed-order attention on CPU (`attend_rows.cpp`, in the library `library.py` builds).

Design. `fixed_chunk_attention` keeps a query's bits the same in any step by running every query
through one fixed order of torch ops: about fifteen small ops and two batched matmuls a layer, with
the calls padded so that the gemms reduce the same way at every size. Their dispatch, not their
arithmetic, is most of a batch-1 decode's attention time. This kernel computes each (sequence,
query, head) alone in one loop nest, in an order fixed by the query itself (its first and last
visible key, read from its mask row), so neither the other queries of the call nor the keys'
padding change a bit; threads split the (sequence, query, head) triples. It reads keys and values
where the cache holds them, through each sequence's slots, so a step gathers no copy of its
context. It takes an fp32 query, keys and values stored as fp32 or fp16 (widened exactly as they
are read) and no softcap; `fixed_chunk_attention` keeps its torch path for anything else, which is
a stage's whole life (the compute dtype and softcap are fixed per stage), so a stage never mixes
the two.
"""

from __future__ import annotations

import torch

from mohawk_shard.kernels.library import kernel


def supports(query: torch.Tensor, keys: torch.Tensor, softcap: float | None) -> bool:
    """Whether this call can run the kernel: an fp32 query on CPU against fp32 or fp16 keys, without
    a softcap, where it builds."""
    return (
        softcap is None
        and query.device.type == "cpu"
        and query.dtype == torch.float32
        and keys.dtype in (torch.float32, torch.float16)
        and kernel() is not None
    )


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v per query: query [B, Q, H, D]; keys/values [KVH, S, D] (a cache's
    pools) read where they lie, key j of sequence b at slot `slots[b, j]` (int64 [B, L]); mask
    additive [B, Q, L] (0 or -inf) -> [B, Q, H·D]. The op `torch.ops.mohawk.attend_rows`."""
    return torch.ops.mohawk.attend_rows.default(query, keys, values, slots, mask, scale)
