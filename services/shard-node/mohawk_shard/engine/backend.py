"""The one plug-in point between a stage and the array library that runs it (torch, MLX)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.forward_batch import ForwardBatch


class Backend(Protocol):
    """Runs layers [start, end) of one model on one device, against its own paged KV cache."""

    name: str
    device: str
    start: int
    end: int
    has_embedding: bool
    has_head: bool

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights this stage holds."""
        ...

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block of `block_size` slots costs across this stage's layers."""
        ...

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None: ...

    def forward(self, batch: ForwardBatch, hidden: Any | None) -> Any:
        """Hidden states for the next stage, or (last stage) logits of `batch.logits_rows`."""
        ...

    def sample(
        self, logits: Any, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]
    ) -> list[SampledToken]:
        """One token per logits row, each with its sequence's sampling params and output so far."""
        ...

    def encode_hidden(self, hidden: Any) -> tuple[str, list[int], bytes]:
        """Hidden states as (dtype name, shape, raw little-endian bytes): what crosses the wire."""
        ...

    def decode_hidden(self, dtype: str, shape: Sequence[int], data: bytes) -> Any:
        """The backend's own array from what `encode_hidden` (of any backend) produced."""
        ...
