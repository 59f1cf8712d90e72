"""A step that mixes decoders, a fresh prompt and a continuing prompt chunk attends part by part,
and gives every sequence the logits it gets in a step of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.attention_metadata import AttentionMetadata, part_groups
from mohawk_shard.model.forward_batch import ForwardBatch

from .test_architectures import build_tiny

BLOCK = 4


@pytest.fixture(scope="module")
def tiny_source(bundled: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    directory: Path = tmp_path_factory.mktemp("attention-parts")
    build_tiny("llama-gqa4-tied", directory, bundled.load_tokenizer())
    return open_model(directory)


def test_decoders_go_together_and_each_chunk_alone() -> None:
    groups = part_groups(np.array([1, 7, 1, 1, 3]))
    assert [g.tolist() for g in groups] == [[0, 2, 3], [1], [4]]
    assert [g.tolist() for g in part_groups(np.array([1, 1, 1]))] == [[0, 1, 2]]
    assert [g.tolist() for g in part_groups(np.array([9]))] == [[0]]


@pytest.mark.parametrize("invariant", [True, False], ids=["fixed-chunks", "fast"])
def test_mixed_step_matches_each_sequence_alone(tiny_source: ModelSource, invariant: bool) -> None:
    """Both ways to attend (the default, and `batch_invariant` off, which no other test runs). The
    linear layers run 4-bit, as the bundled model's do: their row kernels give a row the same bits
    in any step, so the default's attention must too, to the bit. (fp32 weights would not show it:
    a lone decode row's gemv differs from the same row in a taller gemm, by up to 1.7e-5 of 2.7
    in these logits on an AVX-512 Xeon, `linear.py`.)"""
    config = tiny_source.config
    history = {  # sequence -> (tokens already in its cache, tokens this step, block table)
        "decoder a": (list(range(100, 111)), [5], [7, 2, 9]),
        "continuing chunk": (list(range(300, 306)), [31, 32, 33, 34], [4, 11, 12]),
        "decoder b": (list(range(500, 503)), [6], [13]),
        "fresh prompt": ([], [41, 42, 43, 44, 45, 46], [0, 1]),
    }

    def backend_with_history() -> TorchBackend:
        backend = make_backend(
            "torch",
            tiny_source,
            0,
            config.num_layers,
            device="cpu",
            dtype="float32",
            weights="int4",
            batch_invariant=invariant,
        )
        assert isinstance(backend, TorchBackend)
        backend.allocate_kv_cache(16, BLOCK)
        for past, _, table in history.values():
            if past:
                backend.forward(ForwardBatch.build([(past, 0, table, True)], BLOCK), None)
        return backend

    mixed_backend = backend_with_history()
    chunks = [(step, len(past), table, True) for past, step, table in history.values()]
    batch = ForwardBatch.build(chunks, BLOCK)
    meta = AttentionMetadata.build(batch, mixed_backend.rotary, torch.device("cpu"), fixed_chunks=invariant)
    assert [(p.num_seqs, p.max_query_len, p.fresh_prompt) for p in meta.parts] == [
        (2, 1, False),
        (1, 4, False),
        (1, 6, True),
    ]
    mixed = mixed_backend.forward(batch, None)

    alone_backend = backend_with_history()
    for row, (past, step, table) in enumerate(history.values()):
        alone = alone_backend.forward(ForwardBatch.build([(step, len(past), table, True)], BLOCK), None)
        if invariant:
            assert torch.equal(mixed[row], alone[0]), list(history)[row]
        else:
            torch.testing.assert_close(mixed[row], alone[0], atol=1e-5, rtol=1e-5)
