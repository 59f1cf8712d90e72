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
    """Several sequences of one KV group decoding greedily in one batch a step: each prompt is
    prefilled on its own, then every step decodes all of them together. Yields the logits [n, vocab]
    of each decode step's input tokens (a copy). Sequence i takes blocks i·count, i·count + 1, ..."""
    count = -(-(max(map(len, prompts)) + steps) // block_size)
    tables = [list(range(i * count, (i + 1) * count)) for i in range(len(prompts))]

    def forward(chunks: list[tuple[list[int], int, list[int], bool]]) -> torch.Tensor:
        with torch.inference_mode():
            return stage.forward(ForwardBatch.build(chunks, block_size), None)

    last = [forward([(list(p), 0, tables[i], True)])[-1] for i, p in enumerate(prompts)]
    logits = torch.stack(last)
    positions = [len(p) for p in prompts]
    for _ in range(steps):
        yield logits.clone()
        tokens = logits.argmax(-1).tolist()
        logits = forward([([t], positions[i], tables[i], True) for i, t in enumerate(tokens)])
        positions = [p + 1 for p in positions]
