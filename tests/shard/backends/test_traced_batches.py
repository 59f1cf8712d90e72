"""Decode steps of several sequences replayed from a trace (`model/traced_decode.py`): a batch runs
padded to its recorded size, the padding sequences in a spare block of their own, and every real
row's logits are eager's bit for bit. On CUDA these are CUDA graphs (`CUDA_BATCH_SIZES`,
`tests/shard/model/test_cuda_graph_step.py`); here the same steps are TorchScript traces on CPU, in
the default mode (native quantized weights, batch invariant)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.traced_decode import TracedDecode, pad_batch, padded_size
from tests.shard.engine.test_gguf_architectures import write_tiny_gguf
from tests.shard.greedy_steps import greedy_together

BLOCK = 16
PROMPTS = [[1, 504, 3458, 282, 260], [1, 9690, 314, 253, 1345, 28, 1115, 1341, 30], [2, 17, 99]]


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return open_model(None)


def stage(
    source: ModelSource, sizes: tuple[int, ...] | None, blocks: int = 24, block_size: int = BLOCK
) -> TorchBackend:
    """`source` on CPU recording steps of `sizes` sequences after one eager step (None: never
    traced)."""
    backend = TorchBackend(source, 0, source.config.num_layers, device="cpu", trace_decode_after=1)
    if sizes is None:
        backend.traced_decode = None
    else:
        assert backend.traced_decode is not None
        windows = backend.traced_decode.windows
        backend.traced_decode = TracedDecode(backend.model, backend.rotary, 1, windows, sizes)
    backend.allocate_kv_cache(blocks, block_size)
    return backend


def assert_same_logits(
    traced: TorchBackend, eager: TorchBackend, prompts: list[list[int]], steps: int, block_size: int
) -> None:
    """Both stages decode `prompts` together greedily; every step's logits are equal bit for bit."""
    for step, (a, b) in enumerate(
        zip(
            greedy_together(traced, prompts, steps, block_size),
            greedy_together(eager, prompts, steps, block_size),
            strict=True,
        )
    ):
        assert torch.equal(a, b), f"step {step}"


def test_a_batch_is_padded_to_the_next_size_recorded() -> None:
    sizes = (1, 2, 4, 8, 16, 24, 32)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 9, 17, 25, 32, 33)] == [
        1,
        2,
        4,
        8,
        16,
        24,
        32,
        32,
        None,
    ]
    batch = ForwardBatch.build(
        [([7], 20, [0, 1], True), ([9], 40, [2, 3, 4], True), ([5], 3, [5], True)], BLOCK
    )
    padded, inputs = pad_batch(batch, torch.tensor([7, 9, 5]), 4, pad_block=30)
    assert padded.token_ids.tolist() == [7, 9, 5, 0] and inputs.tolist() == [7, 9, 5, 0]
    assert padded.positions.tolist() == [20, 40, 3, 0] and padded.context_lens.tolist() == [21, 41, 4, 1]
    assert padded.block_tables[3].tolist() == [30, 30, 30] and padded.logits_rows.tolist() == [0, 1, 2, 3]
    assert padded.slot_mapping[3] == 30 * BLOCK and padded.context_slots()[3].tolist()[:1] == [30 * BLOCK]
    hidden = torch.ones(3, 8)
    _, grown = pad_batch(batch, hidden, 4, pad_block=30)
    assert grown[:3].equal(hidden) and not grown[3].any()  # a padding row's hidden state is zeros


@pytest.mark.parametrize("sizes", [(1, 2, 4), (1, 3)], ids=["three-padded-to-four", "three-exactly"])
def test_several_decoders_replayed_give_eager_logits_bit_for_bit(
    bundled: ModelSource, sizes: tuple[int, ...]
) -> None:
    """Three sequences of different lengths decode together over contexts of 4 to 74: the 64 and
    128 buckets (a batch's bucket is its longest context's), each recorded once and kept."""
    steps = 65
    traced, eager = stage(bundled, sizes), stage(bundled, None)
    assert traced.traced_decode is not None and traced.traced_decode.pad_block == 24
    assert traced.kv_caches[0].key.shape[1] == 25 * BLOCK and eager.kv_caches[0].key.shape[1] == 24 * BLOCK
    assert_same_logits(traced, eager, PROMPTS, steps, BLOCK)
    kept = traced.traced_decode._traces
    size = sizes[-1]
    assert set(kept) == {(size, (64,)), (size, (128,))} and all(t is not None for t in kept.values())


def test_the_padding_rows_write_only_the_spare_block(bundled: ModelSource) -> None:
    backend = stage(bundled, (1, 4))
    for cache in backend.kv_caches:
        cache.key.fill_(0.5)  # a value no step writes
    list(greedy_together(backend, PROMPTS[:3], 20, BLOCK))
    key = backend.kv_caches[0].key
    written = (key != 0.5).any(dim=2).any(dim=0).nonzero().flatten().numpy()
    count = -(-(max(map(len, PROMPTS)) + 20) // BLOCK)  # greedy_together's blocks per sequence
    lengths = [len(p) + 20 for p in PROMPTS]  # the prompt, then 20 decoded tokens
    real = np.concatenate([i * count * BLOCK + np.arange(n) for i, n in enumerate(lengths)])
    assert set(written.tolist()) == set(real.tolist()) | {24 * BLOCK}  # the spare block's first slot


def test_batches_past_the_largest_size_or_with_a_prompt_chunk_run_eager(bundled: ModelSource) -> None:
    backend = stage(bundled, (1, 2))
    traced = backend.traced_decode
    assert traced is not None
    three = ForwardBatch.build([([7], 9, [0], True), ([9], 9, [1], True), ([5], 9, [2], True)], BLOCK)
    mixed = ForwardBatch.build([([7], 9, [0], True), ([9, 4], 9, [1], True)], BLOCK)
    assert traced.applies(ForwardBatch.build([([7], 9, [0], True), ([9], 9, [1], True)], BLOCK))
    assert not traced.applies(three) and not traced.applies(mixed)


def test_sliding_layers_replayed_several_at_a_time_bit_for_bit(tmp_path: Path) -> None:
    """Gemma 3 (five sliding layers of window 4 and one full, six KV groups): three sequences padded
    to four decode together over contexts up to 84, the sliding groups' views moving along their
    windows, and every step's logits are unpadded eager's."""
    source, _ = write_tiny_gguf("gemma3", tmp_path, native=True)
    prompts, steps, block = [list(range(3, 17)), list(range(5, 12)), [9, 8, 7]], 70, 4
    blocks = len(model_kv_groups(source.config)) * len(prompts) * -(-(14 + steps) // block)
    traced, eager = stage(source, (1, 2, 4), blocks, block), stage(source, None, blocks, block)
    assert_same_logits(traced, eager, prompts, steps, block)
    assert traced.traced_decode is not None
    kept = traced.traced_decode._traces
    assert kept and {size for size, _ in kept} == {4} and all(t is not None for t in kept.values())
