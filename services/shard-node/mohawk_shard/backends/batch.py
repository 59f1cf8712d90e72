"""`ForwardBatch`: what one stage computes in one step, as plain arrays any backend can read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Tokens of several sequences laid end to end, with where their KV lives.

    Sequence `b` contributes `query_lens[b]` tokens at positions `context_lens[b] - query_lens[b]`
    onwards; after the step its KV covers `context_lens[b]` tokens, found through `block_tables[b]`.
    `logits_rows` picks the token rows whose logits the last stage needs (one per sampled sequence).
    """

    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray
    block_size: int

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.query_lens.shape[0])

    @property
    def max_query_len(self) -> int:
        return int(self.query_lens.max())

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max())

    @property
    def token_seq_index(self) -> np.ndarray:
        """For each token row, the index of its sequence in the batch."""
        return np.repeat(np.arange(self.num_seqs), self.query_lens)

    @property
    def slot_mapping(self) -> np.ndarray:
        """KV slot of each token row: block id × block size + offset within the block."""
        tables = self.block_tables[self.token_seq_index, self.positions // self.block_size]
        return tables * self.block_size + self.positions % self.block_size

    def context_slots(self) -> np.ndarray:
        """[num_seqs, max_context_len] KV slots of each position a sequence attends to (0 past its end)."""
        positions = np.arange(self.max_context_len)
        blocks = np.minimum(positions // self.block_size, self.block_tables.shape[1] - 1)
        slots = self.block_tables[:, blocks] * self.block_size + positions % self.block_size
        return np.where(positions[None, :] < self.context_lens[:, None], slots, 0)

    @classmethod
    def build(
        cls,
        chunks: list[tuple[list[int], int, list[int], bool]],
        block_size: int,
        *,
        all_logits: bool = False,
    ) -> ForwardBatch:
        """From (token ids, start position, block table, sample) per sequence, in batch order."""
        query_lens = np.array([len(c[0]) for c in chunks], dtype=np.int64)
        starts = np.array([c[1] for c in chunks], dtype=np.int64)
        max_blocks = max(len(c[2]) for c in chunks)
        tables = np.zeros((len(chunks), max_blocks), dtype=np.int64)
        for row, chunk in enumerate(chunks):
            tables[row, : len(chunk[2])] = chunk[2]
        ends = np.cumsum(query_lens)
        token_ids = np.fromiter((t for c in chunks for t in c[0]), dtype=np.int64, count=int(ends[-1]))
        positions = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(
            ends - query_lens - starts, query_lens
        )
        if all_logits:
            logits_rows = np.arange(int(ends[-1]), dtype=np.int64)
        else:
            logits_rows = np.array([ends[i] - 1 for i, c in enumerate(chunks) if c[3]], dtype=np.int64)
        return cls(token_ids, positions, query_lens, starts + query_lens, tables, logits_rows, block_size)
