"""What one step's attention layers share: slots to write, and the parts each is attended in.

Design. Everything that depends only on the batch shape (slots, masks, rotary cos/sin) is built
once per step here and shared by all layers. A step is cut into parts, each attended in one call:
all its decoding sequences together, and each prompt chunk on its own (padding chunks and decoders
to one query length would cost every decoder as many query rows as the longest chunk). A part holds
its context slots (or, when they are consecutive, just their range), its masks, and the gather
buffers every layer reuses. With KV groups (`mohawk_common.kv_groups`) each group of the stage gets
its own `GroupStep`: its table's slots, and for a sliding group parts whose context starts at the
first block the window still holds (the block manager has given the earlier ones back, so they are
never read); positions inside such a part count from that block, which leaves causality and the
window, differences of positions, as they were. A group without a window is built exactly as
before, so a model without sliding layers runs the path it always ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from mohawk_shard.model.fixed_chunk_attention import CHUNK, allowed_keys, key_reach, pool_rows
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_quant import TierPlan
from mohawk_shard.model.rope import RotaryTable


@dataclass(frozen=True, slots=True)
class ColdContext:
    """Flat context positions read from the int8 tier, their int8 slots and blocks, and the rest."""

    index: torch.Tensor
    slots: torch.Tensor
    blocks: torch.Tensor
    hot_index: torch.Tensor
    hot_slots: torch.Tensor


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
    fixed_masks: dict[str, tuple[torch.Tensor, np.ndarray]] = field(default_factory=dict)
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
            length = int(self.context_lens.max())
            allowed = allowed_keys(self.query_lens, self.context_lens, window, length)
            mask = additive_mask(torch.from_numpy(allowed[None]).to(like.device), like.dtype)
            self.scratch[key] = mask
        return mask

    def fixed_chunk_mask(
        self, window: int | None, padded_len: int, device: torch.device
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Additive float32 mask [num_seqs, max_query, padded_len] for `fixed_chunk_attention`, and
        each query index's `key_reach`; built once a step per window."""
        key = f"fixed{window}"
        cached = self.fixed_masks.get(key)
        if cached is None:
            if self.query_lens is None or self.context_lens is None:
                raise RuntimeError("an attention part without its sequence lengths")
            allowed = allowed_keys(self.query_lens, self.context_lens, window, padded_len)
            mask = additive_mask(torch.from_numpy(allowed).to(device), torch.float32)
            cached = self.fixed_masks[key] = (mask, key_reach(allowed))
        return cached

    def head_rows(self, pool: torch.Tensor) -> torch.Tensor:
        """The context slots as rows of `pool` viewed [kv_heads × slots, dim], head by head."""
        rows = self.scratch.get("rows")
        if rows is None:
            if self.context_slots is None:
                raise RuntimeError("attention metadata without context slots for a non-fresh batch")
            rows = self.scratch["rows"] = pool_rows(pool, self.context_slots)
        return rows

    def gather_buffer(self, name: str, pool: torch.Tensor, size: int) -> torch.Tensor:
        """[kv_heads, size, dim] that every layer of the step gathers `name` into: one allocation a
        step, not one a layer (each fresh buffer of megabytes costs its page faults again)."""
        buffer = self.scratch.get(name)
        if buffer is None:
            buffer = self.scratch[name] = pool.new_empty(pool.shape[0], size, pool.shape[2])
        return buffer


@dataclass(slots=True)
class GroupStep:
    """One KV group's share of a step: the slots its layers write, and the parts they attend in."""

    slot_mapping: torch.Tensor
    parts: list[AttentionPart]


@dataclass(slots=True)
class AttentionMetadata:
    """What a step's layers share: rotary cos/sin and, per KV group of the stage, a `GroupStep`."""

    cos: torch.Tensor
    sin: torch.Tensor
    groups: dict[int, GroupStep]
    local_rotary: tuple[torch.Tensor, torch.Tensor] | None = None  # sliding layers' own base (Gemma 3)
    fixed_chunks: bool = False  # attend every query in one order (`fixed_chunk_attention.py`)

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self._first.slot_mapping

    @property
    def parts(self) -> list[AttentionPart]:
        """The parts of the stage's first group (its only one without sliding layers)."""
        return self._first.parts

    @property
    def _first(self) -> GroupStep:
        return next(iter(self.groups.values()))

    @classmethod
    def build(
        cls,
        batch: ForwardBatch,
        rotary: RotaryTable,
        device: torch.device,
        tiers: TierPlan | None = None,
        windows: Mapping[int, int | None] | None = None,
        fixed_chunks: bool = False,
    ) -> AttentionMetadata:
        """Everything a step's layers share; `tiers` maps slots to the hot pool in two-tier mode;
        `windows`: the stage's KV groups and their windows (default one full-attention group 0);
        `fixed_chunks`: batch-invariant attention."""

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)

        positions = tensor(batch.positions)
        cos, sin = rotary.lookup(positions)
        align = window_align(batch.block_size, fixed_chunks)
        groups = {
            group: group_step(group_view(batch, group, window, align), tiers, rotary.cos.dtype, tensor)
            for group, window in (windows or {0: None}).items()
        }
        return cls(cos, sin, groups, rotary.lookup_local(positions), fixed_chunks)


def window_align(block_size: int, fixed_chunks: bool) -> int:
    """Blocks a sliding group's first block is rounded down to a multiple of: fixed chunks count
    from a sliding part's first block, so keep that on a multiple of CHUNK."""
    return CHUNK // block_size if fixed_chunks and CHUNK % block_size == 0 else 1


def group_view(batch: ForwardBatch, group: int, window: int | None, align: int) -> ForwardBatch:
    """The step as one KV group's layers read it: the group's block tables and, for a sliding
    group, from the first block its window still holds (rounded down to a multiple of `align`
    blocks), positions counted from there (the mask keeps only their differences)."""
    view = batch.for_group(group)
    return view if window is None else view.from_window(window, align)


def group_step(
    batch: ForwardBatch,
    tiers: TierPlan | None,
    dtype: torch.dtype,
    tensor: Callable[[np.ndarray], torch.Tensor],
) -> GroupStep:
    """A group's step from its view (`group_view`): its writes go where its table says."""
    slot_mapping = batch.slot_mapping if tiers is None else tiers.slot_mapping
    context = StepContext(batch, tiers)
    groups = part_groups(batch.query_lens)
    first_rows = np.cumsum(batch.query_lens) - batch.query_lens
    parts = []
    for seqs in groups:
        part = build_part(batch, seqs, context, dtype, tensor)
        if len(groups) > 1 and part.max_query_len == 1:
            part.rows = tensor(first_rows[seqs])
        elif len(groups) > 1:
            part.row_range = (int(first_rows[seqs[0]]), int(batch.query_lens[seqs[0]]))
        parts.append(part)
    return GroupStep(tensor(slot_mapping), parts)


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
