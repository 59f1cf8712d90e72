"""Activation frames: header + raw bytes, chunked under max_payload, joined back exactly."""

from __future__ import annotations

import pytest
import torch

from mohawk_common.bus.frames import FrameAssembler, FrameError, decode_frame, encode_frames
from mohawk_proto.v1 import bus_pb2, engine_pb2
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.node.wire import (
    sampling_from_proto,
    sampling_to_proto,
    step_batch_from_proto,
    step_batch_to_proto,
    tensor_from_bytes,
    tensor_to_bytes,
)
from mohawk_shard.stage import SequenceSpec, SequenceStep, StepBatch


def _header(step_id: int) -> bus_pb2.ActivationHeader:
    return bus_pb2.ActivationHeader(
        plan_version=3, stage=1, step=engine_pb2.StepBatch(step_id=step_id), dtype="float32", shape=[4, 8]
    )


@pytest.mark.parametrize("size", [0, 10, 5000, 50_000])
def test_frames_fit_max_payload_and_join_back(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frames = encode_frames(_header(7), data, max_payload=4096)
    assert all(len(f) <= 4096 for f in frames)
    assembler = FrameAssembler()
    results = [assembler.add(f) for f in frames]
    assert all(r is None for r in results[:-1])
    last = results[-1]
    assert last is not None
    header, joined = last
    assert joined == data and header.step.step_id == 7 and list(header.shape) == [4, 8]


def test_a_chunk_without_its_start_is_refused() -> None:
    frames = encode_frames(_header(1), bytes(20_000), max_payload=4096)
    with pytest.raises(FrameError):
        FrameAssembler().add(frames[1])
    with pytest.raises(FrameError):
        decode_frame(b"\xff\xff\xff\x00abc")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hidden_states_cross_as_raw_bytes(dtype: torch.dtype) -> None:
    tensor = torch.randn(5, 7).to(dtype)
    name, shape, data = tensor_to_bytes(tensor)
    assert len(data) == tensor.numel() * tensor.element_size()
    back = tensor_from_bytes(name, shape, data, torch.device("cpu"))
    assert back.dtype == dtype and torch.equal(back, tensor)


def test_step_batches_and_sampling_survive_the_wire() -> None:
    params = SamplingParams.create(temperature=0.5, top_p=0.9, seed=3, max_tokens=9, stop=("x",), logprobs=2)
    assert sampling_from_proto(sampling_to_proto(params)) == params
    assert sampling_from_proto(sampling_to_proto(SamplingParams.create())) == SamplingParams.create()
    batch = StepBatch(
        4,
        (
            SequenceStep(1, 0, (5, 6, 7), (0,), True, SequenceSpec(3, params, (9,))),
            SequenceStep(2, 10, (8,), (), True),
        ),
        (0,),
    )
    message = step_batch_to_proto(batch, {1: ("req-1", [6, 7])}, with_token_ids=True)
    back, joining = step_batch_from_proto(engine_pb2.StepBatch.FromString(message.SerializeToString()))
    assert back == batch
    assert joining == {1: ("req-1", (6, 7))}
