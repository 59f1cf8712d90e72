"""A stage stacked from two consecutive ranges (a node's own and the standby it held) gives the bits
one backend of the whole range gives, prompt and decodes, in the default mode."""

from __future__ import annotations

import pytest
import torch

from mohawk_common.model_store import ModelSource
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.stacked import StackedBackend, parts_of
from mohawk_shard.model.forward_batch import ForwardBatch
from tests.shard.engine import test_architectures as architectures

BLOCK = 4


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    return architectures.tiny_source(tmp_path_factory)


def _run(backend: object, steps: list[tuple[list[int], int]]) -> list[torch.Tensor]:
    """Logits of one sequence's prompt, then of each decode, through `backend`."""
    table = [0, 1, 2, 3]
    outs = []
    for tokens, past in steps:
        batch = ForwardBatch.build([(tokens, past, table, True)], BLOCK)
        outs.append(backend.forward(batch, None))  # type: ignore[attr-defined]
    return outs


def test_two_ranges_stacked_give_the_whole_ranges_bits(tiny_source: ModelSource) -> None:
    layers = tiny_source.config.num_layers
    whole = make_backend("torch", tiny_source, 0, layers, device="cpu")
    stacked = StackedBackend(
        [
            make_backend("torch", tiny_source, 0, 2, device="cpu"),
            make_backend("torch", tiny_source, 2, layers),
        ]
    )
    assert (stacked.start, stacked.end, stacked.has_embedding, stacked.has_head) == (0, layers, True, True)
    assert stacked.weight_bytes == sum(p.weight_bytes for p in stacked.parts)
    for backend in (whole, stacked):
        backend.allocate_kv_cache(8, BLOCK)
    prompt = [5, 200, 17, 40, 33, 2, 77]
    steps = [(prompt, 0)] + [([11 + i], len(prompt) + i) for i in range(6)]
    for ours, theirs in zip(_run(stacked, steps), _run(whole, steps), strict=True):
        assert torch.equal(ours, theirs)
    assert parts_of(stacked) == (stacked, *stacked.parts) and parts_of(whole) == (whole,)


def test_ranges_that_do_not_meet_are_refused(tiny_source: ModelSource) -> None:
    first, last = (make_backend("torch", tiny_source, a, b, device="cpu") for a, b in ((0, 1), (2, 4)))
    with pytest.raises(ValueError, match=r"\[0, 1\).*cannot be followed by \[2, 4\)"):
        StackedBackend([first, last])
    with pytest.raises(ValueError, match="two ranges"):
        StackedBackend([first])
