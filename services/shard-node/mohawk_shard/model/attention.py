"""Attention over a paged KV cache, batched across sequences of different lengths.

Two ways to attend a part, chosen per step (`AttentionMetadata.fixed_chunks`, from the stage's
`batch_invariant` setting): by default `attend_fixed_chunks`, which computes every query in one
fixed order whatever part it is in (`fixed_chunk_attention.py`: the bits of a sequence's output
do not depend on its batch); with the setting off, `attend_fast`, whose shapes are described here.

Design. Each layer's cache is two head-major tensors of shape [kv_heads, num_blocks × block_size,
head_dim]; a step writes its new keys and values into their slots with one `index_copy_`, then
gathers every sequence's context through its block table into a padded [kv_heads, batch, context,
head_dim] tensor, which the batched matmuls read as it lies (a slot-major cache made every decode
step copy the gathered K and V once more into the matmul's layout). The gather buffers are
allocated once a step and reused by every layer. What depends only on the batch shape is built once
per step in `AttentionMetadata` (`attention_metadata.py`), which cuts the step into parts, each
attended in one call. Three shapes keep the parts cheap: a fresh
prompt attends causally to its own keys with no gather (torch's fused SDPA); several decoders (one
query each) run as two batched matmuls, query heads grouped over the KV head they share (no copies
of K/V per query head); one sequence continuing (a decode or a later chunk) runs torch's fused
SDPA over its context, masked by absolute position, which never materialises the [query ×
context] scores. A single sequence whose context sits in consecutive slots (blocks come off the
free list in order) reads it as a view, with no gather at all. With an int8 tier (`kv_quant.py`)
slots are those of the hot pool, and context that is cold is dequantized into the gathered tensor.
The cache itself (`KVCache`, its int8 store) is `kv_cache.py`'s.

Layers differ in three ways, given per call as `AttentionOptions`: the score scale (Gemma's
`query_pre_attn_scalar`), a sliding window (a query at position p sees keys in (p - window, p],
masked from each part's positions, built once a step per window size and only when some context
reaches past it), and tanh soft-capping of the scores (Gemma 2), which torch's fused kernels cannot
do, so a capped layer computes its scores explicitly. A sliding layer's cache belongs to a KV group
(`mohawk_common.kv_groups`) whose blocks behind the window go back to the pool: it writes and
reads through its group's slots and parts, which start at the first block the window still holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mohawk_shard.model.attention_metadata import AttentionMetadata, AttentionPart
from mohawk_shard.model.fixed_chunk_attention import attend_in_fixed_order, padded_length
from mohawk_shard.model.kv_cache import Int8Store, KVCache, dequantize


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    """How one layer attends: `scale` of the scores (None: head_dim^-0.5), a sliding `window` (a query
    sees itself and the window - 1 keys before it; None: all), tanh `softcap` of the scores (None: off)."""

    scale: float | None = None
    window: int | None = None
    softcap: float | None = None


FULL_ATTENTION = AttentionOptions()


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """query [T, H, D], key/value [T, KVH, D] of this step's tokens -> attention output [T, H·D]."""
    step = meta.groups[cache.group]
    cache.key.index_copy_(1, step.slot_mapping, key.transpose(0, 1).to(cache.key.dtype))
    cache.value.index_copy_(1, step.slot_mapping, value.transpose(0, 1).to(cache.value.dtype))
    attend = attend_fixed_chunks if meta.fixed_chunks else attend_fast
    if len(step.parts) == 1:
        return attend(step.parts[0], query, key, value, cache, options)
    num_tokens, num_heads, head_dim = query.shape
    out = query.new_empty(num_tokens, num_heads * head_dim)
    for part in step.parts:
        if part.row_range is not None:
            first, count = part.row_range
            q, k, v = (t.narrow(0, first, count) for t in (query, key, value))
            out.narrow(0, first, count).copy_(attend(part, q, k, v, cache, options))
        elif part.rows is not None:
            rows, k, v = query.index_select(0, part.rows), key, value
            if part.fresh_prompt:  # a one-token prompt beside chunks: its own key and value only
                k, v = key.index_select(0, part.rows), value.index_select(0, part.rows)
            out.index_copy_(0, part.rows, attend(part, rows, k, v, cache, options))
        else:
            raise RuntimeError("an attention part of a split step without its rows")
    return out


def attend_fixed_chunks(
    part: AttentionPart,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: KVCache,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """One part's attention, each query in the one order of `fixed_chunk_attention` (batch invariant)."""
    num_tokens, num_heads, head_dim = query.shape
    if part.context_lens is None:
        raise RuntimeError("an attention part without its sequence lengths")
    padded = padded_length(int(part.context_lens.max()))
    slots = None
    if part.fresh_prompt:
        # as the cache holds them (fp16 on CPU): a later chunk or step reads them from there
        stored = (t.to(cache.key.dtype) for t in (key, value))
        keys, values = (t.transpose(0, 1).unsqueeze(1) for t in stored)  # [KVH, 1, P, D]
    elif part.context_slots is not None and part.cold is None:
        # the cache's pools and each sequence's slots: no gathered copy where the kernel reads them
        keys, values, slots = cache.key, cache.value, part.context_slots.view(part.num_seqs, -1)
    else:
        batch, kv_heads = part.num_seqs, cache.key.shape[0]
        keys = gather_context(cache.key, cache.key_int8, part, "key")
        values = gather_context(cache.value, cache.value_int8, part, "value")
        keys, values = (t.view(kv_heads, batch, -1, head_dim) for t in (keys, values))
    mask, reach = part.fixed_chunk_mask(options.window, padded, query.device)
    queries = query.reshape(part.num_seqs, part.max_query_len, num_heads, head_dim)
    out = attend_in_fixed_order(queries, keys, values, mask, options.scale, options.softcap, reach, slots)
    return out.view(num_tokens, num_heads * head_dim)


def attend_fast(
    part: AttentionPart,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: KVCache,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """One part's attention; `key`/`value` are read only for a fresh prompt (others read the cache)."""
    num_tokens, num_heads, head_dim = query.shape
    windowed = part.reaches_past(options.window)
    mask = part.position_mask(options.window, query) if windowed else part.mask
    if part.fresh_prompt:
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        if windowed or options.softcap is not None:
            mask = part.position_mask(options.window, query)
            out = explicit_attention(q, k, v, mask, options)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True, scale=options.scale
            )
        return out.squeeze(0).transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
    batch, kv_heads = part.num_seqs, cache.key.shape[0]
    keys, values = (
        gather_context(pool, home, part, name).view(kv_heads, batch, -1, head_dim).to(query.dtype)
        for pool, home, name in ((cache.key, cache.key_int8, "key"), (cache.value, cache.value_int8, "value"))
    )
    if part.max_query_len == 1 and batch > 1:
        return grouped_decode(query, keys, values, mask, options)
    # one sequence (decoding, or a chunk continuing a prompt): torch's fused kernel
    q = query.view(1, num_tokens, num_heads, head_dim).transpose(1, 2)
    if options.softcap is not None:
        out = explicit_attention(q, keys.transpose(0, 1), values.transpose(0, 1), mask, options)
    else:
        out = F.scaled_dot_product_attention(
            q,
            keys.transpose(0, 1),
            values.transpose(0, 1),
            attn_mask=mask,
            enable_gqa=True,
            scale=options.scale,
        )
    return out.transpose(1, 2).reshape(num_tokens, num_heads * head_dim)


def explicit_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    options: AttentionOptions,
) -> torch.Tensor:
    """softmax(softcap(q·kᵀ·scale) + mask)·v for one sequence: query [1, H, Q, D], keys/values
    [1, KVH, L, D] -> [1, H, Q, D]; the scores are materialised, for what SDPA cannot do."""
    group = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = score(query, keys, options)
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values)


def score(query: torch.Tensor, keys: torch.Tensor, options: AttentionOptions) -> torch.Tensor:
    """q·kᵀ scaled (default head_dim^-0.5) and, with `options.softcap`, squashed by cap·tanh(s / cap)."""
    scale = options.scale if options.scale is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query * scale, keys.transpose(-1, -2))
    if options.softcap is not None:
        scores = torch.tanh(scores / options.softcap) * options.softcap
    return scores


def gather_context(
    pool: torch.Tensor, home: Int8Store | None, part: AttentionPart, name: str
) -> torch.Tensor:
    """Every sequence's context slots, [kv_heads, num_seqs × max_context_len, dim]."""
    if part.context_range is not None:
        return pool.narrow(1, *part.context_range)
    if part.cold is None:
        rows = part.head_rows(pool)
        out = part.gather_buffer(name, pool, rows.shape[0] // pool.shape[0])
        # rows of the flattened [kv_heads × slots, dim] pool: twice as fast as index_select on dim 1
        torch.index_select(pool.view(-1, pool.shape[2]), 0, rows, out=out.view(-1, pool.shape[2]))
        return out
    if home is None:
        raise RuntimeError("attention metadata with cold context on a cache without an int8 tier")
    cold = part.cold
    out = part.gather_buffer(name, pool, cold.index.shape[0] + cold.hot_index.shape[0])
    scales = home.scale.index_select(0, cold.blocks)
    cold_rows = dequantize(home.data.index_select(0, cold.slots), scales, pool.dtype)
    out.index_copy_(1, cold.index, cold_rows.transpose(0, 1))
    return out.index_copy_(1, cold.hot_index, pool.index_select(1, cold.hot_slots))


def grouped_decode(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """softmax(q·kᵀ/√d + mask)·v for one query per sequence, query heads grouped over the KV head
    they share.

    query [B, H, D], keys/values [KVH, B, L, D], mask additive [1, B, 1, L] or None -> [B, H·D].
    Two batched matmuls over (KV head, sequence); on CPU this beats SDPA's kernels at decode sizes.
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[0]
    q = query.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).transpose(0, 1)
    scores = score(q, keys, options)  # [KVH, B, group, L]
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.matmul(probs, values)  # [KVH, B, group, D]
    return out.transpose(0, 1).reshape(batch, num_heads * head_dim)
