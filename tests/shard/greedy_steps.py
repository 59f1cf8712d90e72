"""A stage decoding greedily one token a step, for tests that compare two stages' logits step by step."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch


def greedy(stage: TorchBackend, prompt: Sequence[int], steps: int, block_size: int) -> Iterator[torch.Tensor]:
    """Logits of the prompt's last token, then of each greedy decode step (a copy each: a replayed
    CUDA graph hands back its own buffer); the sequence takes blocks 0, 1, ... in order."""
    blocks = list(range(-(-(len(prompt) + steps) // block_size)))
    with torch.inference_mode():
        logits = stage.forward(ForwardBatch.build([(list(prompt), 0, blocks, True)], block_size), None)
        for position in range(len(prompt), len(prompt) + steps):
            yield logits.clone()
            token = int(logits[-1].argmax())
            logits = stage.forward(ForwardBatch.build([([token], position, blocks, True)], block_size), None)
