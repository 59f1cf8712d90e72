"""Fixed-order attention on CPU (`attend_rows.cpp`, in the library `library.py` builds).

Design. `fixed_chunk_attention` keeps a query's bits the same in any step by running every query
through one fixed order of torch ops: about fifteen small ops and two batched matmuls a layer, with
the calls padded so that the gemms reduce the same way at every size. Their dispatch, not their
arithmetic, is most of a batch-1 decode's attention time. This kernel computes each (sequence,
query, head) alone in one loop nest, in an order fixed by the query itself (its first and last
visible key, read from its mask row), so neither the other queries of the call nor the keys'
padding change a bit; threads split the (sequence, query, head) triples. It takes fp32 tensors and
no softcap; `fixed_chunk_attention` keeps its torch path for anything else, which is a stage's
whole life (the compute dtype and softcap are fixed per stage), so a stage never mixes the two.
"""

from __future__ import annotations

from ctypes import CDLL

import torch

from mohawk_shard.kernels.library import kernel, register, require


def supports(query: torch.Tensor, keys: torch.Tensor, softcap: float | None) -> bool:
    """Whether this call can run the kernel: fp32 on CPU without a softcap, where it builds."""
    return (
        softcap is None
        and query.device.type == "cpu"
        and query.dtype == keys.dtype == torch.float32
        and kernel() is not None
    )


def attend(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v per query: query [B, Q, H, D], keys/values [KVH, B, L, D], mask
    additive [B, Q, L] (0 or -inf) -> [B, Q, H·D]."""
    return _traceable(query, keys, values, mask, scale)


def _run(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    return run(require(), query, keys, values, mask, scale)


def run(
    library: CDLL,
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`attend` through a given build of the library (tests compare the AVX2 and AVX-512 builds)."""
    batch, num_queries, num_heads, head_dim = query.shape
    kv_heads, key_batch, length, key_dim = keys.shape
    if key_batch != batch or key_dim != head_dim or num_heads % kv_heads or values.shape != keys.shape:
        raise ValueError(f"attend_rows: query {tuple(query.shape)} against keys {tuple(keys.shape)}")
    if mask.shape != (batch, num_queries, length):
        raise ValueError(f"attend_rows: mask {tuple(mask.shape)}, not {(batch, num_queries, length)}")
    q, m = query.contiguous(), mask.to(torch.float32).contiguous()
    k, v = keys, values  # read in place (a narrowed cache): any strides but a key's own values
    if k.stride(-1) != 1 or v.stride() != k.stride():
        k, v = keys.contiguous(), values.contiguous()
    out = torch.empty(batch, num_queries, num_heads * head_dim, dtype=torch.float32)
    if out.numel() == 0:
        return out
    library.mohawk_attend_rows(
        q.data_ptr(), batch, num_queries, num_heads, head_dim, k.data_ptr(), v.data_ptr(), kv_heads,
        length, *k.stride()[:3], m.data_ptr(), scale, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


_traceable = register(
    "attend_rows(Tensor query, Tensor keys, Tensor values, Tensor mask, float scale) -> Tensor", _run
)
