"""`ForwardBatch`: what one stage computes in one step, as plain arrays any backend can read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from mohawk_common.kv_groups import NULL_BLOCK


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Tokens of several sequences laid end to end, with where their KV lives.

    Sequence `b` contributes `query_lens[b]` tokens at positions `context_lens[b] - query_lens[b]`
    onwards; after the step its KV covers `context_lens[b]` tokens, found through `block_tables[b]`.
    `logits_rows` picks the token rows whose logits the last stage needs (one per sampled sequence).
    A model with several KV groups (`mohawk_common.kv_groups`) has a table per group: `block_tables`
    is group 0's, `group_tables` the others' (a sliding group's entries behind its window are
    `NULL_BLOCK`, never read).
    """

    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray
    block_size: int
    group_tables: tuple[np.ndarray, ...] = ()

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
        table = self.block_tables[:, blocks]
        slots = table * self.block_size + positions % self.block_size
        return np.where((positions[None, :] < self.context_lens[:, None]) & (table != NULL_BLOCK), slots, 0)

    def for_group(self, group: int) -> ForwardBatch:
        """This step as KV group `group` sees it: its block table in `block_tables` (a batch with one
        table, as a stage of one group may be given, serves that table to its group)."""
        if group == 0 or not self.group_tables:
            return self
        return replace(self, block_tables=self.group_tables[group - 1], group_tables=())

    def from_window(self, window: int, align: int = 1) -> ForwardBatch:
        """This step from the first block each sequence's `window` still needs (its first query's
        window start, rounded down to a block, and to a multiple of `align` blocks), positions
        counted from there: the context a sliding layer reads. Differences of positions, all that
        causality and the window look at, stay. Blocks taken in by `align` that were given back
        read as slot 0 (`context_slots`), before the window and so masked."""
        first_query = self.context_lens - self.query_lens
        first_block = np.maximum(0, first_query - window + 1) // self.block_size // align * align
        if not first_block.any():
            return self
        num_blocks = self.block_tables.shape[1] - int(first_block.min())
        index = np.minimum(first_block[:, None] + np.arange(num_blocks), self.block_tables.shape[1] - 1)
        shift = first_block * self.block_size
        return replace(
            self,
            positions=self.positions - np.repeat(shift, self.query_lens),
            context_lens=self.context_lens - shift,
            block_tables=np.take_along_axis(self.block_tables, index, axis=1),
        )

    @classmethod
    def build(
        cls,
        chunks: list[tuple[list[int], int, list[int], bool]],
        block_size: int,
        *,
        all_logits: bool = False,
        group_tables: Sequence[Sequence[list[int]]] = (),
    ) -> ForwardBatch:
        """From (token ids, start position, block table, sample) per sequence, in batch order;
        `group_tables`, with several KV groups: per sequence, the tables of groups 1, 2, ..."""
        query_lens = np.array([len(c[0]) for c in chunks], dtype=np.int64)
        starts = np.array([c[1] for c in chunks], dtype=np.int64)
        tables = _pad([c[2] for c in chunks])
        more = (
            tuple(_pad([t[g] for t in group_tables]) for g in range(len(group_tables[0])))
            if group_tables
            else ()
        )
        ends = np.cumsum(query_lens)
        token_ids = np.fromiter((t for c in chunks for t in c[0]), dtype=np.int64, count=int(ends[-1]))
        positions = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(
            ends - query_lens - starts, query_lens
        )
        if all_logits:
            logits_rows = np.arange(int(ends[-1]), dtype=np.int64)
        else:
            logits_rows = np.array([ends[i] - 1 for i, c in enumerate(chunks) if c[3]], dtype=np.int64)
        return cls(
            token_ids, positions, query_lens, starts + query_lens, tables, logits_rows, block_size, more
        )


def _pad(tables: list[list[int]]) -> np.ndarray:
    """Block tables as rows of one array, zero-padded to the longest."""
    out = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int64)
    for row, table in enumerate(tables):
        out[row, : len(table)] = table
    return out
