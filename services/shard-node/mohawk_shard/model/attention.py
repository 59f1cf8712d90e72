"""Attention over a paged KV cache, batched across sequences of different lengths.

Design. Each layer's cache is two head-major tensors of shape [kv_heads, num_blocks × block_size,
head_dim]; a step writes its new keys and values into their slots with one `index_copy_`, then
gathers every sequence's context through its block table into a padded [kv_heads, batch, context,
head_dim] tensor, which the batched matmuls read as it lies (a slot-major cache made every decode
step copy the gathered K and V once more into the matmul's layout). The gather buffers are
allocated once a step and reused by every layer. Everything that depends only on the batch shape
(slots, masks, rotary cos/sin) is built once per step in `AttentionMetadata` and shared by all
layers. A step is cut into parts, each attended in one call: all its decoding sequences together,
and each prompt chunk on its own (padding chunks and decoders to one query length would cost every
decoder as many query rows as the longest chunk). Three shapes keep the parts cheap: a fresh
prompt attends causally to its own keys with no gather (torch's fused SDPA); several decoders (one
query each) run as two batched matmuls, query heads grouped over the KV head they share (no copies
of K/V per query head); one sequence continuing (a decode or a later chunk) runs torch's fused
SDPA over its context, masked by absolute position, which never materialises the [query ×
context] scores. A single sequence whose context sits in consecutive slots (blocks come off the
free list in order) reads it as a view, with no gather at all. With an int8 tier (`kv_quant.py`)
slots are those of the hot pool, and context that is cold is dequantized into the gathered tensor.

Layers differ in three ways, given per call as `AttentionOptions`: the score scale (Gemma's
`query_pre_attn_scalar`), a sliding window (a query at position p sees keys in (p - window, p],
masked from each part's positions, built once a step per window size and only when some context
reaches past it), and tanh soft-capping of the scores (Gemma 2), which torch's fused kernels cannot
do, so a capped layer computes its scores explicitly. Blocks wholly outside every window stay in the
cache: freeing them is the block manager's job (a follow-up), the mask alone keeps results exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from mohawk_shard.backends.batch import ForwardBatch
from mohawk_shard.model.kv_quant import Int8Store, TierPlan, dequantize
from mohawk_shard.model.rope import RotaryTable


@dataclass(slots=True)
class KVCache:
    """One layer's cache: K and V [kv_heads, slots, head_dim] in the compute dtype, and their int8
    homes in two-tier mode."""

    key: torch.Tensor
    value: torch.Tensor
    key_int8: Int8Store | None = None
    value_int8: Int8Store | None = None


@dataclass(frozen=True, slots=True)
class ColdContext:
    """Flat context positions read from the int8 tier, their int8 slots and blocks, and the rest."""

    index: torch.Tensor
    slots: torch.Tensor
    blocks: torch.Tensor
    hot_index: torch.Tensor
    hot_slots: torch.Tensor


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    """How one layer attends: `scale` of the scores (None: head_dim^-0.5), a sliding `window` (a query
    sees itself and the window - 1 keys before it; None: all), tanh `softcap` of the scores (None: off)."""

    scale: float | None = None
    window: int | None = None
    softcap: float | None = None


FULL_ATTENTION = AttentionOptions()


@dataclass(slots=True)
class AttentionPart:
    """Sequences attended together in one call: every decoding sequence of a step, or one prompt chunk.

    `row_range` (a prompt chunk's consecutive token rows) or `rows` (decoders' rows) picks the part's
    queries from the step's; both are None when the part is the whole step.
    """

    num_seqs: int
    max_query_len: int
    fresh_prompt: bool
    row_range: tuple[int, int] | None = None
    rows: torch.Tensor | None = None
    context_slots: torch.Tensor | None = None
    context_range: tuple[int, int] | None = None
    cold: ColdContext | None = None
    mask: torch.Tensor | None = None
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)
    query_lens: np.ndarray | None = None
    context_lens: np.ndarray | None = None

    def reaches_past(self, window: int | None) -> bool:
        """Whether some query of the part has context older than `window` positions."""
        return window is not None and self.context_lens is not None and int(self.context_lens.max()) > window

    def position_mask(self, window: int | None, like: torch.Tensor) -> torch.Tensor:
        """Additive mask from absolute positions: causal, within `window` when given, inside each
        sequence's context; [1, num_seqs, max_query, max_context], built once a step per window."""
        key = f"mask{window}"
        mask = self.scratch.get(key)
        if mask is None:
            if self.query_lens is None or self.context_lens is None:
                raise RuntimeError("an attention part without its sequence lengths")
            q_lens, c_lens = self.query_lens, self.context_lens
            query_pos = (c_lens - q_lens)[:, None, None] + np.arange(int(q_lens.max()))[None, :, None]
            key_pos = np.arange(int(c_lens.max()))[None, None, :]
            allowed = (key_pos <= query_pos) & (key_pos < c_lens[:, None, None])
            if window is not None:
                allowed &= key_pos > query_pos - window
            mask = additive_mask(torch.from_numpy(allowed[None]).to(like.device), like.dtype)
            self.scratch[key] = mask
        return mask

    def head_rows(self, pool: torch.Tensor) -> torch.Tensor:
        """The context slots as rows of `pool` viewed [kv_heads × slots, dim], head by head."""
        rows = self.scratch.get("rows")
        if rows is None:
            if self.context_slots is None:
                raise RuntimeError("attention metadata without context slots for a non-fresh batch")
            kv_heads, num_slots, _ = pool.shape
            heads = torch.arange(kv_heads, device=pool.device)[:, None] * num_slots
            rows = self.scratch["rows"] = (heads + self.context_slots.view(1, -1)).view(-1)
        return rows

    def gather_buffer(self, name: str, pool: torch.Tensor, size: int) -> torch.Tensor:
        """[kv_heads, size, dim] that every layer of the step gathers `name` into: one allocation a
        step, not one a layer (each fresh buffer of megabytes costs its page faults again)."""
        buffer = self.scratch.get(name)
        if buffer is None:
            buffer = self.scratch[name] = pool.new_empty(pool.shape[0], size, pool.shape[2])
        return buffer


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    parts: list[AttentionPart]
    local_rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # sliding layers' own base (Gemma 3)

    @classmethod
    def build(
        cls, batch: ForwardBatch, rotary: RotaryTable, device: torch.device, tiers: TierPlan | None = None
    ) -> AttentionMetadata:
        """Everything a step's layers share; `tiers` maps slots to the hot pool in two-tier mode."""

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

        positions = tensor(batch.positions)
        cos, sin = rotary.lookup(positions)
        slot_mapping = batch.slot_mapping if tiers is None else tiers.slot_mapping
        context = StepContext(batch, tiers)
        groups = part_groups(batch.query_lens)
        first_rows = np.cumsum(batch.query_lens) - batch.query_lens
        parts = []
        for seqs in groups:
            part = build_part(batch, seqs, context, rotary.cos.dtype, tensor)
            if len(groups) > 1 and part.max_query_len == 1:
                part.rows = tensor(first_rows[seqs])
            elif len(groups) > 1:
                part.row_range = (int(first_rows[seqs[0]]), int(batch.query_lens[seqs[0]]))
            parts.append(part)
        return cls(tensor(slot_mapping), cos, sin, parts, rotary.lookup_local(positions))


def part_groups(query_lens: np.ndarray) -> list[np.ndarray]:
    """Sequence indices of each part: all decoders together, each prompt chunk alone.

    A chunk's queries would otherwise be padded to the longest chunk for every sequence in the
    step, decoders included: 32 decoders beside one 378-token chunk cost 32 × 378 query rows.
    """
    if query_lens.shape[0] == 1 or int(query_lens.max()) == 1:
        return [np.arange(query_lens.shape[0])]
    decoding = np.flatnonzero(query_lens == 1)
    chunks = [np.array([i]) for i in np.flatnonzero(query_lens > 1)]
    return ([decoding] if decoding.size else []) + chunks


class StepContext:
    """The step's context slots ([num_seqs, max_context_len]) and, in two-tier mode, which are cold."""

    def __init__(self, batch: ForwardBatch, tiers: TierPlan | None) -> None:
        self.block_size = batch.block_size
        self._batch, self._tiers = batch, tiers
        self._slots: np.ndarray | None = None
        self._cold: np.ndarray | None = None

    @property
    def slots(self) -> np.ndarray:
        if self._slots is None:
            tiers = self._tiers
            self._slots = self._batch.context_slots() if tiers is None else tiers.context_slots
        return self._slots

    @property
    def cold_slots(self) -> np.ndarray | None:
        """int8 slot of each cold position, -1 where hot; None when nothing is cold."""
        tiers = self._tiers
        if tiers is None or tiers.cold_index is None or tiers.cold_slots is None:
            return None
        if self._cold is None:
            self._cold = np.full(self.slots.shape, -1, dtype=np.int64)
            self._cold.reshape(-1)[tiers.cold_index] = tiers.cold_slots
        return self._cold


def build_part(
    batch: ForwardBatch,
    seqs: np.ndarray,
    context: StepContext,
    dtype: torch.dtype,
    tensor: Callable[[np.ndarray], torch.Tensor],
) -> AttentionPart:
    query_lens, context_lens = batch.query_lens[seqs], batch.context_lens[seqs]
    max_query, max_context = int(query_lens.max()), int(context_lens.max())
    fresh = seqs.shape[0] == 1 and int(context_lens[0]) == int(query_lens[0])
    part = AttentionPart(
        int(seqs.shape[0]), max_query, fresh, query_lens=query_lens, context_lens=context_lens
    )
    if fresh:
        return part
    slots = context.slots[seqs, :max_context]
    cold = context.cold_slots
    cold = None if cold is None else cold[seqs, :max_context]
    if cold is not None and (cold >= 0).any():
        part.cold = cold_context(slots, cold, context.block_size, tensor)
    else:
        part.context_range = contiguous_range(slots)
    if part.context_range is None:
        part.context_slots = tensor(slots)
    key_pos = np.arange(max_context)
    if max_query == 1:
        if (context_lens != max_context).any():
            valid = key_pos[None, :] < context_lens[:, None]
            part.mask = additive_mask(tensor(valid[None, :, None, :]), dtype)  # [1, B, 1, L]
        return part
    # one prompt chunk continuing a sequence: its rows attend up to their own positions
    query_pos = int(context_lens[0] - query_lens[0]) + np.arange(max_query)
    part.mask = additive_mask(tensor((key_pos[None, :] <= query_pos[:, None])[None, None]), dtype)
    return part


def contiguous_range(context_slots: np.ndarray) -> tuple[int, int] | None:
    """(first slot, length) when one sequence's context is consecutive slots, else None."""
    if context_slots.shape[0] != 1:
        return None
    row = context_slots[0]
    if row.size == 0 or int(row[-1]) - int(row[0]) != row.size - 1 or (np.diff(row) != 1).any():
        return None
    return int(row[0]), int(row.size)


def cold_context(
    hot_slots: np.ndarray,
    cold_slots: np.ndarray,
    block_size: int,
    tensor: Callable[[np.ndarray], torch.Tensor],
) -> ColdContext:
    flat_cold = cold_slots.reshape(-1)
    is_cold = flat_cold >= 0
    (cold_index,) = np.nonzero(is_cold)
    (hot_index,) = np.nonzero(~is_cold)
    cold = flat_cold[cold_index]
    return ColdContext(
        tensor(cold_index),
        tensor(cold),
        tensor(cold // block_size),
        tensor(hot_index),
        tensor(hot_slots.reshape(-1)[hot_index]),
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, -inf where it is not."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    options: AttentionOptions = FULL_ATTENTION,
) -> torch.Tensor:
    """query [T, H, D], key/value [T, KVH, D] of this step's tokens -> attention output [T, H·D]."""
    cache.key.index_copy_(1, meta.slot_mapping, key.transpose(0, 1))
    cache.value.index_copy_(1, meta.slot_mapping, value.transpose(0, 1))
    if len(meta.parts) == 1:
        return attend(meta.parts[0], query, key, value, cache, options)
    num_tokens, num_heads, head_dim = query.shape
    out = query.new_empty(num_tokens, num_heads * head_dim)
    for part in meta.parts:
        if part.row_range is not None:
            first, count = part.row_range
            q, k, v = (t.narrow(0, first, count) for t in (query, key, value))
            out.narrow(0, first, count).copy_(attend(part, q, k, v, cache, options))
        elif part.rows is not None:
            rows = query.index_select(0, part.rows)
            out.index_copy_(0, part.rows, attend(part, rows, key, value, cache, options))
        else:
            raise RuntimeError("an attention part of a split step without its rows")
    return out


def attend(
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
    keys = gather_context(cache.key, cache.key_int8, part, "key").view(kv_heads, batch, -1, head_dim)
    values = gather_context(cache.value, cache.value_int8, part, "value").view(kv_heads, batch, -1, head_dim)
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
