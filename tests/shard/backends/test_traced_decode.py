"""Batch-1 decode replayed from a trace gives eager's numbers bit for bit (`model/traced_decode.py`),
on the bundled model and on a Gemma 3 file with sliding layers and two rotary bases, in the default
mode (native quantized weights, batch invariant)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.traced_decode import TRACE_AFTER, context_bucket, group_bucket
from tests.shard.engine.test_gguf_architectures import write_tiny_gguf
from tests.shard.greedy_steps import greedy

BLOCK = 16
PROMPT = [1, 504, 3458, 282, 260, 3563, 30, 2]  # eight ids of the bundled vocabulary


@pytest.fixture(scope="module")
def bundled() -> ModelSource:
    return open_model(None)


def backend(
    source: ModelSource, trace_after: int | None, blocks: int = 32, block_size: int = BLOCK
) -> TorchBackend:
    stage = TorchBackend(source, 0, source.config.num_layers, device="cpu", trace_decode_after=trace_after)
    stage.allocate_kv_cache(blocks, block_size)
    return stage


def test_the_bucket_pads_to_a_power_of_two_of_whole_chunks() -> None:
    assert [context_bucket(n) for n in (1, 64, 65, 128, 129, 1000)] == [64, 64, 128, 128, 256, 1024]
    # a sliding group never reads more than its window and one chunk: 512 + 63 keys at most
    assert [group_bucket(n, 512) for n in (64, 65, 512, 575)] == [64, 128, 512, 576]


def test_sliding_layers_and_a_second_rotary_base_are_traced_bit_for_bit(tmp_path: Path) -> None:
    """Gemma 3 (five sliding layers of window 4 to one full, each its own KV group, local and global
    rotary bases): contexts of 15 to 144, long enough that the sliding groups move their first
    chunk twice, give eager's logits at every step, and every bucket pair is kept."""
    source, _ = write_tiny_gguf("gemma3", tmp_path, native=True)
    prompt, steps, block = list(range(3, 17)), 130, 4
    blocks = len(model_kv_groups(source.config)) * -(-(len(prompt) + steps) // block)
    traced, eager = backend(source, 1, blocks, block), backend(source, None, blocks, block)
    assert traced.traced_decode is not None and len(traced.traced_decode.windows) == 6
    for step, (a, b) in enumerate(
        zip(greedy(traced, prompt, steps, block), greedy(eager, prompt, steps, block), strict=True)
    ):
        assert torch.equal(a, b), f"step {step}"
    assert not torch.is_inference_mode_enabled()  # two interleaved steppers leave it as it was
    kept = traced.traced_decode._traces
    assert all(t is not None for t in kept.values())
    assert {size for size, _ in kept} == {1}
    full = {buckets[0] for _, buckets in kept}
    sliding = {buckets[1:] for _, buckets in kept}
    assert full == {64, 128, 256} and sliding == {(64,) * 5, (128,) * 5}  # capped at 4 + 63 keys


def test_traced_steps_give_eager_logits_bit_for_bit_across_buckets(bundled: ModelSource) -> None:
    steps = 130 - len(PROMPT)  # contexts of 9 to 130: the 64, 128 and 256 buckets
    traced, eager = backend(bundled, 1), backend(bundled, None)
    assert traced.traced_decode is not None and eager.traced_decode is None
    for step, (a, b) in enumerate(
        zip(greedy(traced, PROMPT, steps, BLOCK), greedy(eager, PROMPT, steps, BLOCK), strict=True)
    ):
        assert torch.equal(a, b), f"step {step}"
    kept = traced.traced_decode._traces
    assert set(kept) == {(1, (64,)), (1, (128,)), (1, (256,))} and all(t is not None for t in kept.values())


def test_a_trace_that_differs_from_eager_is_dropped_and_the_bucket_stays_eager(
    bundled: ModelSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = backend(bundled, 2)
    traced = stage.traced_decode
    assert traced is not None
    real = stage._eager
    calls = []

    def eager_but_off_by_a_bit(batch: ForwardBatch, inputs: torch.Tensor) -> torch.Tensor:
        calls.append(batch.num_tokens)
        out = real(batch, inputs)
        return out if batch.num_tokens > 1 else torch.nextafter(out, out + 1)

    monkeypatch.setattr(stage, "_eager", eager_but_off_by_a_bit)
    list(greedy(stage, PROMPT, 6, BLOCK))
    assert traced._traces == {(1, (64,)): None}  # checked on its second step, found different, dropped
    assert len(calls) == 7  # the prompt, then all six decode steps eager


def test_not_traced_in_the_faster_mode_or_with_an_int8_tier(bundled: ModelSource) -> None:
    fast = TorchBackend(bundled, 0, bundled.config.num_layers, device="cpu", batch_invariant=False)
    fast.allocate_kv_cache(32, BLOCK)
    tiered = TorchBackend(bundled, 0, bundled.config.num_layers, device="cpu", kv_cache_dtype="int8")
    tiered.allocate_kv_cache(32, BLOCK)
    for stage in (fast, tiered):
        stage.traced_decode.trace_after = 1  # type: ignore[union-attr]
        list(greedy(stage, PROMPT, 4, BLOCK))
        assert stage.traced_decode._traces == {}  # type: ignore[union-attr]


def test_the_engine_traces_long_answers_and_they_keep_their_tokens(bundled: ModelSource) -> None:
    """Past `TRACE_AFTER` steps in a bucket the engine decodes from the trace; the answer is the one
    an engine that never traces gives (which the batch-invariance tests tie to every batch shape)."""

    def make() -> LLMEngine:
        return build_local_engine(EngineSettings(num_threads=2, num_kv_blocks=64), source=bundled)

    params = SamplingParams(temperature=0.0, max_tokens=TRACE_AFTER + 24, ignore_eos=True)
    traced, eager = make(), make()
    eager.stages[0].backend.traced_decode = None  # type: ignore[attr-defined]
    answers = [e.generate([PROMPT], params)[0].token_ids for e in (traced, eager)]
    assert answers[0] == answers[1] and len(answers[0]) == TRACE_AFTER + 24
    kept = traced.stages[0].backend.traced_decode._traces  # type: ignore[attr-defined]
    assert kept and all(t is not None for t in kept.values())


def test_a_traced_step_reads_its_context_padded_with_its_last_slot_and_masked(bundled: ModelSource) -> None:
    stage = backend(bundled, 1)
    traced = stage.traced_decode
    assert traced is not None
    batch = ForwardBatch.build([([7], 70, [3, 4, 5, 6, 7], True)], BLOCK)  # context of 71
    inputs = torch.tensor([7])
    _, rotary, slots, contexts, masks, keys, values = traced._trace_inputs(
        batch, [batch], inputs, stage.kv_caches, [128]
    )
    (slot,), (context,), (mask,) = slots, contexts, masks
    first = 3 * BLOCK
    assert context.shape == (1, 128)
    assert context[0].tolist() == list(range(first, first + 71)) + [first + 70] * 57
    assert (
        slot.tolist() == [first + 70] and len(rotary) == 2 and rotary[0].shape[0] == rotary[1].shape[0] == 1
    )
    assert mask.shape == (1, 1, 128) and not mask[..., :71].any() and torch.isinf(mask[..., 71:]).all()
    assert keys[0] is stage.kv_caches[0].key and values[-1] is stage.kv_caches[-1].value
