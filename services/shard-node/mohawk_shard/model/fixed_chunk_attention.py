"""Attention whose result for a query is the same whatever else the step holds (batch invariance).

Design. Fused SDPA, the grouped decode matmuls and a softmax over a padded context each reduce over
the keys in an order that depends on the call: how long the longest context of the step is, whether
the query is part of a prompt chunk or a decode, how many sequences share the call. The sums then
associate differently and a query's output moves in its last bits, which greedy decoding turns into
different text. Here every query is computed with one fixed order. The context is cut into chunks
of CHUNK keys counted from the sequence's first position and padded with masked keys to whole
chunks. The scores are one matmul whose reduction runs over the head dimension only, the same for
every query (checked for gemm shapes by `tests/shard/model/test_fixed_chunk_attention.py`). MKL
on AVX2 CPUs computes the rows of a call of fewer than 12 rows past its last whole tile of four with
another kernel, which reduces differently (an AMD EPYC's fp32: a decode's 3 query heads per KV head
gave other bits than the same rows inside a prompt chunk); so a call's queries are padded with
zero queries to at least `MIN_GEMM_ROWS` rows per KV head, whose outputs are dropped, and every
gemm is tall enough that a row's bits do not depend on the row count. The
maximum is taken over all the query's keys, exact in any order. exp(score - max) is summed and
multiplied into the values per chunk of exactly CHUNK keys (one gemm shape whatever the context),
and the chunks are added in order by a cumulative sum, so masked chunks past a query's end add
exact zeros and a longer padded context changes nothing. Prompt chunks, decodes, a sequence alone
or among 31 others, before or after a failover's recompute: the same arithmetic for each query.
A sliding layer reads from the first block its window still holds; that start is kept on a
multiple of CHUNK positions (`ForwardBatch.from_window`'s `align`), so its chunks stay where the
prefill had them (leading chunks the prefill masked added exact zeros there).
This is the default (`batch_invariant`); the faster path of `attention.py` serves with it off.
On an x86 CPU with AVX2 and a compiler, fp32 stages without a softcap run the same per-query
contract in one compiled call (`kernels/attend_rows.py`: each query alone, in an order its own mask
fixes), and the torch ops below serve everything else; `attend_in_fixed_order` chooses.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mohawk_shard.kernels import attend_rows

CHUNK = 64  # keys per chunk: one gemm shape for every query, whatever its context
QUERY_TILE = 128  # a longer prompt chunk's queries go this many at a time
MIN_GEMM_ROWS = 12  # rows (queries × heads per KV head) every attention gemm runs at least (`linear.py`)


def padded_length(context_len: int) -> int:
    return -(-context_len // CHUNK) * CHUNK


def allowed_keys(
    query_lens: np.ndarray, context_lens: np.ndarray, window: int | None, padded_len: int
) -> np.ndarray:
    """[num_seqs, max_query, padded_len]: which keys each query sees (causal, inside its sequence's
    context, and within `window` when given); padding queries see their sequence's first key."""
    max_query = int(query_lens.max())
    query_pos = (context_lens - query_lens)[:, None, None] + np.arange(max_query)[None, :, None]
    key_pos = np.arange(padded_len)[None, None, :]
    allowed = (key_pos <= query_pos) & (key_pos < context_lens[:, None, None])
    if window is not None:
        allowed &= key_pos > query_pos - window
    allowed[:, :, 0] |= ~allowed.any(axis=-1)  # never a query with no key (its row is dropped)
    return allowed


def key_reach(allowed: np.ndarray) -> np.ndarray:
    """[max_query]: for each query index, how many leading keys some sequence's query there sees."""
    last = allowed.shape[-1] - np.argmax(allowed[..., ::-1], axis=-1)  # [num_seqs, max_query]
    return last.max(axis=0)


def attend_in_fixed_order(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    reach: np.ndarray | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fixed_chunk_attention`'s contract for keys/values [KVH, B, L, D] of any length L up to the
    mask's, or, with `slots` [B, L], for a cache's pools [KVH, S, D] whose slot `slots[b, j]` holds
    key j of sequence b. The compiled kernel, where it serves (`kernels/attend_rows.py`), reads them
    where they lie (each query only its own keys); the torch ops get them gathered and zero-padded
    to the mask's length."""
    if attend_rows.supports(query, keys, softcap):
        scale = scale if scale is not None else query.shape[-1] ** -0.5
        if slots is None:
            kv_heads, batch, length, head_dim = keys.shape
            keys, values = (t.reshape(kv_heads, batch * length, head_dim) for t in (keys, values))
            slots = torch.arange(batch * length, device=keys.device).view(batch, length)
        return attend_rows.attend(query, keys, values, slots, mask[..., : slots.shape[1]], scale)
    if slots is not None:
        keys, values = (gather_slots(t, slots) for t in (keys, values))
    keys, values = keys.to(query.dtype), values.to(query.dtype)  # a cache stored narrower: exact
    padded = mask.shape[-1]
    return fixed_chunk_attention(
        query, pad_keys(keys, padded), pad_keys(values, padded), mask, scale, softcap, reach
    )


def pool_rows(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows of `pool` [KVH, S, D] viewed as [KVH·S, D] that hold `slots` (any shape), head by
    head: gathering them is twice as fast as index_select on dim 1."""
    kv_heads, num_slots, _ = pool.shape
    heads = torch.arange(kv_heads, device=pool.device)[:, None] * num_slots
    return (heads + slots.reshape(1, -1)).reshape(-1)


def gather_slots(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """pool [KVH, S, D] at slots [B, L] -> [KVH, B, L, D]."""
    kv_heads, _, head_dim = pool.shape
    rows = pool_rows(pool, slots)
    return pool.reshape(-1, head_dim).index_select(0, rows).view(kv_heads, *slots.shape, head_dim)


def fixed_chunk_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    reach: np.ndarray | None = None,
) -> torch.Tensor:
    """softmax(softcap(q·kᵀ·scale) + mask)·v, each query in the fixed order the module describes.

    query [B, Q, H, D] (Q queries of each of B sequences), keys/values [KVH, B, L, D] with L a
    multiple of CHUNK, mask additive [B, Q, L] (float32, 0 or -inf) -> [B, Q, H·D]. `reach`
    (`key_reach` of the mask) lets a long prompt chunk run QUERY_TILE queries at a time over only
    the keys they see: half the work of a causal chunk, and scores that stay in cache.
    """
    batch, num_queries, num_heads, head_dim = query.shape
    if keys.shape[2] % CHUNK:
        raise ValueError(f"keys padded to {keys.shape[2]}, not a multiple of {CHUNK}")
    scale = scale if scale is not None else head_dim**-0.5
    if reach is None or num_queries <= QUERY_TILE:
        return _attend(query, keys, values, mask, scale, softcap)
    out = query.new_empty(batch, num_queries, num_heads * head_dim)
    for first in range(0, num_queries, QUERY_TILE):
        last = min(first + QUERY_TILE, num_queries)
        length = padded_length(int(reach[first:last].max()))
        out[:, first:last] = _attend(
            query[:, first:last],
            keys[:, :, :length],
            values[:, :, :length],
            mask[:, first:last, :length],
            scale,
            softcap,
        )
    return out


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    batch, num_queries, num_heads, head_dim = query.shape
    kv_heads, _, padded, _ = keys.shape
    group = num_heads // kv_heads
    short = -(-MIN_GEMM_ROWS // group) - num_queries  # zero queries that make the gemms tall enough
    if short > 0:
        query = F.pad(query, (0, 0, 0, 0, 0, short))
        mask = F.pad(mask, (0, 0, 0, short))  # the padding queries see every key: finite, dropped
        return _attend(query, keys, values, mask, scale, softcap)[:, :num_queries]
    num_chunks = padded // CHUNK
    # [KVH, B, Q·group, D]: each query's heads grouped over the KV head they share
    q = (query * scale).view(batch, num_queries, kv_heads, group, head_dim).permute(2, 0, 1, 3, 4)
    q = q.reshape(kv_heads, batch, num_queries * group, head_dim)
    scores = torch.matmul(q, keys.transpose(-1, -2))  # [KVH, B, Q·group, L]
    weights = scores.float() if scores.dtype != torch.float32 else scores
    if softcap is not None:
        weights.div_(softcap).tanh_().mul_(softcap)
    weights = weights.view(kv_heads, batch, num_queries, group, padded)
    weights.add_(mask.view(1, batch, num_queries, 1, padded))
    weights.sub_(weights.amax(dim=-1, keepdim=True)).exp_()
    chunks = weights.view(kv_heads, batch, num_queries * group, num_chunks, CHUNK)
    total = chunks.sum(dim=-1).cumsum(dim=-1)[..., -1:]  # [KVH, B, Q·group, 1]
    per_chunk = torch.matmul(  # [KVH, B, chunks, Q·group, D]
        chunks.to(values.dtype).transpose(2, 3),
        values.view(kv_heads, batch, num_chunks, CHUNK, head_dim),
    )
    summed = per_chunk.float().cumsum(dim=2)[:, :, -1]  # [KVH, B, Q·group, D]
    out = summed.div_(total).to(query.dtype)
    out = out.view(kv_heads, batch, num_queries, group, head_dim).permute(1, 2, 0, 3, 4)
    return out.reshape(batch, num_queries, num_heads * head_dim)


def pad_keys(tensor: torch.Tensor, padded_len: int) -> torch.Tensor:
    """[KVH, B, L, D] zero-padded along L to `padded_len` (a no-op when already that long)."""
    extra = padded_len - tensor.shape[2]
    return tensor if extra == 0 else F.pad(tensor, (0, 0, 0, extra))
