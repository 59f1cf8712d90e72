"""`StackedBackend`: one stage whose layers are held as consecutive ranges, run one after the other.

Design. A failover that gives a node its neighbour's layers, which it holds warm as a standby
(`node/standby.py`), must not load them again: the node's stage for the wider range is its own
backend and the standby's, stacked. A step runs the first range's forward, hands its hidden states
straight to the next (the arrays two nodes would have sent each other, the same bits, without the
wire), and the last range's output is the stage's. Each range keeps its own KV pool, allocated with
the same block count, so the block ids stage 0 hands out address every range alike. Embedding and
sampling are the first and the last range's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.forward_batch import ForwardBatch


class StackedBackend:
    """Layers [parts[0].start, parts[-1].end) as `parts`, each range starting where the last ends."""

    def __init__(self, parts: Sequence[Backend]) -> None:
        if len(parts) < 2:
            raise ValueError("a stacked stage needs two ranges or more")
        for before, after in pairwise(parts):
            if before.end != after.start or before.name != after.name or before.device != after.device:
                raise ValueError(
                    f"layers [{before.start}, {before.end}) on {before.name} {before.device} cannot be "
                    f"followed by [{after.start}, {after.end}) on {after.name} {after.device}"
                )
        self.parts = tuple(parts)
        self.name, self.device = parts[0].name, parts[0].device
        self.start, self.end = parts[0].start, parts[-1].end
        self.has_embedding, self.has_head = parts[0].has_embedding, parts[-1].has_head

    def __copy__(self) -> StackedBackend:
        """Over the same weights with pools of its own (`share_weights`): each range copied."""
        return StackedBackend([copy.copy(part) for part in self.parts])

    @property
    def weight_bytes(self) -> int:
        return sum(part.weight_bytes for part in self.parts)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return sum(part.kv_bytes_per_block(block_size) for part in self.parts)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        for part in self.parts:
            part.allocate_kv_cache(num_blocks, block_size)

    def forward(self, batch: ForwardBatch, hidden: Any | None) -> Any:
        for part in self.parts:
            hidden = part.forward(batch, hidden)
        return hidden

    def sample(
        self, logits: Any, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]
    ) -> list[SampledToken]:
        return self.parts[-1].sample(logits, params, outputs)

    def encode_hidden(self, hidden: Any) -> tuple[str, list[int], bytes]:
        return self.parts[-1].encode_hidden(hidden)

    def decode_hidden(self, dtype: str, shape: Sequence[int], data: bytes) -> Any:
        return self.parts[0].decode_hidden(dtype, shape, data)


def parts_of(backend: Backend | None) -> tuple[Backend, ...]:
    """`backend` and, for a stacked one, every backend it runs (a stack may hold a stack)."""
    if backend is None:
        return ()
    if not isinstance(backend, StackedBackend):
        return (backend,)
    return (backend, *(inner for part in backend.parts for inner in parts_of(part)))
