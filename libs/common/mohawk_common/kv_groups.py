"""KV cache groups: which layers share a block table, and how many blocks a sequence holds.

Design (after vLLM's hybrid KV cache manager). A model whose layers all attend to their whole
context keeps one block table per sequence, shared by every layer: one group, as before. A model
with sliding-window layers (Mistral's `sliding_window`, Gemma 2/3's local layers beside global ones)
needs, in a sliding layer, only the keys of its last `window` positions; the blocks before them can
go back to the pool. So layers are grouped by how they attend, each group with its own block table,
and a sliding group's table gives up its blocks as the window moves on. All groups draw block ids
from one pool, and the groups are cut to one size (the smallest attention type's layer count,
bigger types split round robin): block id `b` then holds, in whichever group owns it, the KV of that
group's layers, and a stage's KV tensor `j` serves the `j`-th layer of every group it holds. One
block id therefore costs a stage `page_layers` layers' KV (the most layers one group has in it),
not all of its layers: Gemma 2 (alternating) pays half a stage per block id and a sequence of L
tokens takes about L/B + window/B ids instead of L/B; an all-sliding Mistral takes about window/B.
Equal groups keep a short sequence's cost what it was: k groups of n/k layers, each holding the same
L/B blocks. Every process derives the groups from the model config with the same rule, so stage 0's
block ids mean the same on every stage.

This module holds the rule and its arithmetic, shared by the shard node (block manager, stages,
capacity) and the coordinator (KV blocks of a stage, context length); it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

NULL_BLOCK = -1  # a sliding group's table entry whose block was given back (or never needed)


@dataclass(frozen=True, slots=True)
class KVGroup:
    """Decoder layers (model-wide indices) that share one block table; `window` None = full attention."""

    layers: tuple[int, ...]
    window: int | None = None

    @property
    def is_sliding(self) -> bool:
        return self.window is not None

    def first_needed_block(self, position: int, block_size: int) -> int:
        """Index of the first block a query at `position` (or later) still reads in this group."""
        if self.window is None:
            return 0
        return max(0, position - self.window + 1) // block_size

    def max_blocks(self, num_tokens: int, block_size: int, chunk: int = 1) -> int:
        """Blocks this group's table holds at most for a sequence of `num_tokens` tokens while it
        computes `chunk` tokens at a time (1: decoding)."""
        num_blocks = -(-num_tokens // block_size)
        if self.window is None:
            return num_blocks
        # a chunk reads the window - 1 positions before it: at most this many blocks, unaligned
        return min(num_blocks, -(-(self.window + chunk + block_size - 2) // block_size))


class LayerWindows(Protocol):
    """What the grouping reads of a model config (`ModelConfig` has it)."""

    num_layers: int

    def layer_window(self, layer: int) -> int | None: ...


def model_kv_groups(config: LayerWindows) -> tuple[KVGroup, ...]:
    """The KV groups of a model, from its config's per-layer windows."""
    return kv_groups([config.layer_window(i) for i in range(config.num_layers)])


def kv_groups(layer_windows: Sequence[int | None]) -> tuple[KVGroup, ...]:
    """The groups of a model whose decoder layer `i` has window `layer_windows[i]` (None: full).

    One attention type: one group of every layer (the default path). Several: each type is cut into
    groups of the smallest type's size, a type's layers dealt round robin (so each group spreads over
    the model and a pipeline stage holds about its share of every group); full attention first.
    """
    types: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        types.setdefault(window, []).append(layer)
    order = sorted(types, key=lambda w: -1 if w is None else w)
    if len(order) <= 1:
        return (KVGroup(tuple(range(len(layer_windows))), order[0] if order else None),)
    size = min(len(layers) for layers in types.values())
    groups: list[KVGroup] = []
    for window in order:
        layers = types[window]
        num_groups = -(-len(layers) // size)
        groups.extend(KVGroup(tuple(layers[j::num_groups]), window) for j in range(num_groups))
    return tuple(groups)


def group_of_layer(groups: Sequence[KVGroup], num_layers: int) -> list[int]:
    """For each decoder layer, the index of its group."""
    owner = [0] * num_layers
    for index, group in enumerate(groups):
        for layer in group.layers:
            owner[layer] = index
    return owner


def page_layers(group_of: Sequence[int], start: int, end: int) -> int:
    """Layers of [start, end) one block id pays for: the most that one group has among them."""
    counts: dict[int, int] = {}
    for layer in range(start, end):
        counts[group_of[layer]] = counts.get(group_of[layer], 0) + 1
    return max(counts.values(), default=0)


def tensor_slots(group_of: Sequence[int], start: int, end: int) -> list[int]:
    """For each layer of [start, end), which of the stage's `page_layers` KV tensors it uses: the
    j-th layer of a group in the stage uses tensor j."""
    seen: dict[int, int] = {}
    slots = []
    for layer in range(start, end):
        group = group_of[layer]
        slots.append(seen.get(group, 0))
        seen[group] = slots[-1] + 1
    return slots


def blocks_per_sequence(groups: Sequence[KVGroup], num_tokens: int, block_size: int, chunk: int = 1) -> int:
    """Block ids a sequence of `num_tokens` tokens holds at most, all groups together, computing
    `chunk` tokens a step."""
    return sum(g.max_blocks(num_tokens, block_size, chunk) for g in groups)


def max_tokens_in(
    groups: Sequence[KVGroup], num_blocks: int, block_size: int, limit: int, chunk: int = 1
) -> int:
    """The longest sequence (at most `limit` tokens) whose blocks fit `num_blocks` ids, computing
    `chunk` tokens a step (a prefill chunk's blocks are held until the window passes them)."""
    if blocks_per_sequence(groups, limit, block_size, chunk) <= num_blocks:
        return limit
    low, high = 0, limit  # blocks_per_sequence grows with the length: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if blocks_per_sequence(groups, mid, block_size, chunk) <= num_blocks:
            low = mid
        else:
            high = mid - 1
    return low
