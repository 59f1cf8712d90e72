"""A stage decoding greedily one token a step, for tests that compare two stages' logits step by step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from mohawk_common.kv_groups import NULL_BLOCK
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch


def greedy(stage: TorchBackend, prompt: Sequence[int], steps: int, block_size: int) -> Iterator[torch.Tensor]:
    """Logits of the prompt's last token, then of each greedy decode step (a copy each: a replayed
    CUDA graph hands back its own buffer). The sequence takes blocks 0, 1, ... in order; with several
    KV groups each group takes the next run of blocks, and a sliding group gives back the blocks
    behind its window as the block manager does (`NULL_BLOCK`)."""
    count = -(-(len(prompt) + steps) // block_size)
    groups = stage.kv_groups

    def batch(tokens: list[int], position: int) -> ForwardBatch:
        tables = []
        for index, group in enumerate(groups):
            first = group.first_needed_block(position, block_size)
            tables.append([NULL_BLOCK if b < first else index * count + b for b in range(count)])
        return ForwardBatch.build(
            [(tokens, position, tables[0], True)],
            block_size,
            group_tables=[tables[1:]] if len(groups) > 1 else (),
        )

    def forward(tokens: list[int], position: int) -> torch.Tensor:
        # inference mode around each call, never across a yield: two of these generators zipped
        # would interleave their enters and exits and leave it on for the rest of the process
        with torch.inference_mode():
            return stage.forward(batch(tokens, position), None)

    logits = forward(list(prompt), 0)
    for position in range(len(prompt), len(prompt) + steps):
        yield logits.clone()
        token = int(logits[-1].argmax())
        logits = forward([token], position)


def greedy_together(
    stage: TorchBackend, prompts: Sequence[Sequence[int]], steps: int, block_size: int
) -> Iterator[torch.Tensor]:
    """Several sequences decoding greedily in one batch a step: each prompt is prefilled on its own,
    then every step decodes all of them together. Yields the logits [n, vocab] of each decode step's
    input tokens (a copy). Sequence i takes, for KV group g, the run of blocks number i·G + g (G
    groups), and a sliding group gives back the blocks behind its window, as `greedy` does."""
    count = -(-(max(map(len, prompts)) + steps) // block_size)
    groups = stage.kv_groups

    def chunk(i: int, tokens: list[int], position: int) -> tuple[list[int], int, list[int], bool]:
        return tokens, position, tables(i, position)[0], True

    def tables(i: int, position: int) -> list[list[int]]:
        out = []
        for g, group in enumerate(groups):
            first = group.first_needed_block(position, block_size)
            base = (i * len(groups) + g) * count
            out.append([NULL_BLOCK if b < first else base + b for b in range(count)])
        return out

    def forward(chunks: list[tuple[list[int], int, list[int], bool]], seqs: list[int]) -> torch.Tensor:
        more = [tables(i, c[1])[1:] for i, c in zip(seqs, chunks, strict=True)] if len(groups) > 1 else ()
        with torch.inference_mode():
            return stage.forward(ForwardBatch.build(chunks, block_size, group_tables=more), None)

    last = [forward([chunk(i, list(p), 0)], [i])[-1] for i, p in enumerate(prompts)]
    logits = torch.stack(last)
    positions = [len(p) for p in prompts]
    seqs = list(range(len(prompts)))
    for _ in range(steps):
        yield logits.clone()
        tokens = logits.argmax(-1).tolist()
        logits = forward([chunk(i, [t], positions[i]) for i, t in enumerate(tokens)], seqs)
        positions = [p + 1 for p in positions]
