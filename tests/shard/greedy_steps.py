"""A stage decoding greedily one token a step, for tests that compare two stages' logits step by step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from mohawk_common.kv_groups import NULL_BLOCK
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch


def group_tables(
    stage: TorchBackend, seq: int, position: int, count: int, block_size: int
) -> list[list[int]]:
    """Sequence `seq`'s block table for each KV group at `position`: group g of sequence i takes
    the run of `count` blocks number i·G + g (G groups), and a sliding group gives back the blocks
    behind its window as the block manager does (`NULL_BLOCK`)."""
    groups = stage.kv_groups
    tables = []
    for g, group in enumerate(groups):
        first = group.first_needed_block(position, block_size)
        base = (seq * len(groups) + g) * count
        tables.append([NULL_BLOCK if b < first else base + b for b in range(count)])
    return tables


def _forward(
    stage: TorchBackend, seqs: Sequence[tuple[int, list[int], int]], count: int, block_size: int
) -> torch.Tensor:
    """One step of `seqs` (sequence number, tokens, position), each with its own group tables."""
    tables = [group_tables(stage, seq, position, count, block_size) for seq, _, position in seqs]
    chunks = [(tokens, position, t[0], True) for (_, tokens, position), t in zip(seqs, tables, strict=True)]
    more = [t[1:] for t in tables] if len(stage.kv_groups) > 1 else ()
    # inference mode around each call, never across a yield: two of these generators zipped
    # would interleave their enters and exits and leave it on for the rest of the process
    with torch.inference_mode():
        return stage.forward(ForwardBatch.build(chunks, block_size, group_tables=more), None)


def greedy(stage: TorchBackend, prompt: Sequence[int], steps: int, block_size: int) -> Iterator[torch.Tensor]:
    """Logits of the prompt's last token, then of each greedy decode step (a copy each: a replayed
    CUDA graph hands back its own buffer). The sequence takes blocks 0, 1, ... in order; with several
    KV groups each group takes the next run of blocks (`group_tables`)."""
    count = -(-(len(prompt) + steps) // block_size)
    logits = _forward(stage, [(0, list(prompt), 0)], count, block_size)
    for position in range(len(prompt), len(prompt) + steps):
        yield logits.clone()
        token = int(logits[-1].argmax())
        logits = _forward(stage, [(0, [token], position)], count, block_size)


def greedy_together(
    stage: TorchBackend, prompts: Sequence[Sequence[int]], steps: int, block_size: int
) -> Iterator[torch.Tensor]:
    """Several sequences decoding greedily in one batch a step: each prompt is prefilled on its own,
    then every step decodes all of them together. Yields the logits [n, vocab] of each decode step's
    input tokens (a copy). Sequence i's blocks are `group_tables`' for i."""
    count = -(-(max(map(len, prompts)) + steps) // block_size)
    last = [_forward(stage, [(i, list(p), 0)], count, block_size)[-1] for i, p in enumerate(prompts)]
    logits = torch.stack(last)
    positions = [len(p) for p in prompts]
    for _ in range(steps):
        yield logits.clone()
        tokens = logits.argmax(-1).tolist()
        logits = _forward(stage, [(i, [t], positions[i]) for i, t in enumerate(tokens)], count, block_size)
        positions = [p + 1 for p in positions]
