"""Frames between stages: header + body, chunked under max_payload, joined back exactly; in plaintext
(insecure) and sealed on a channel, where the header is authenticated and sequence numbers are new."""

from __future__ import annotations

import pytest
import torch

from mohawk_common.bus.channels import SecureChannel
from mohawk_common.bus.frames import (
    KIND_ACTIVATIONS,
    FrameAssembler,
    FrameError,
    FrameOpener,
    activation_payload,
    encode_frames,
    read_activation_payload,
    split_message,
)
from mohawk_common.bus.security import Security
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.handshake import ChannelKeys
from mohawk_pqc.kem import CryptographyKem
from mohawk_proto.v1 import engine_pb2, security_pb2
from mohawk_shard.backends.torch_backend import tensor_from_bytes, tensor_to_bytes
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.stage import SequenceSpec, SequenceStep, StepBatch
from mohawk_shard.node.wire import (
    Joining,
    sampling_from_proto,
    sampling_to_proto,
    step_batch_from_proto,
    step_batch_to_proto,
)


def _header(step_id: int) -> security_pb2.FrameHeader:
    return security_pb2.FrameHeader(
        plan_version=3, stage=1, step_id=step_id, dtype="float32", shape=[4, 8], kind=KIND_ACTIVATIONS
    )


def _join(frames: list[bytes], opener: FrameOpener) -> list[tuple[security_pb2.FrameHeader, bytes] | None]:
    assembler = FrameAssembler()
    return [assembler.add(*opener.open(f)) for f in frames]


class _Channels:
    """The one channel a receiving ChannelManager would hold (no NATS needed to test framing): stage
    1 of 2, its channel from stage 0."""

    stage, num_stages = 1, 2

    def __init__(self, channel: SecureChannel) -> None:
        self.channel = channel

    def stage_of(self, node_id: str) -> int:
        return 0

    def receiving(self, channel_id: bytes) -> SecureChannel:
        if channel_id != self.channel.channel_id:
            raise AuthenticationError("unknown_channel")
        return self.channel


def _channel_pair() -> tuple[SecureChannel, FrameOpener]:
    keys = ChannelKeys(b"c" * 16, b"k" * 32, b"k" * 32, security_pb2.CertificateBody(), 3)
    sending = SecureChannel(keys, FrameSender(keys.send_key), FrameReceiver(keys.receive_key))
    receiving = SecureChannel(keys, FrameSender(keys.send_key), FrameReceiver(keys.receive_key))
    secure = Security(object(), CryptographyKem(), role="shard")  # type: ignore[arg-type]
    return sending, FrameOpener(secure, _Channels(receiving))  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 10, 5000, 50_000])
@pytest.mark.parametrize("sealed", [False, True])
def test_frames_fit_max_payload_and_join_back(size: int, sealed: bool) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    if sealed:
        channel, opener = _channel_pair()
    else:
        channel, opener = None, FrameOpener(Security(None, CryptographyKem(), role="shard"), None)
    frames = encode_frames(_header(7), data, 4096, channel)
    assert all(len(f) <= 4096 for f in frames)
    if sealed and size >= 5000:
        assert data[:1000] not in b"".join(frames)
    results = _join(frames, opener)
    assert all(r is None for r in results[:-1])
    last = results[-1]
    assert last is not None
    header, joined = last
    assert joined == data and header.step_id == 7 and list(header.shape) == [4, 8]


def test_sealed_frames_reject_tampering_replay_and_plaintext() -> None:
    channel, opener = _channel_pair()
    frames = encode_frames(_header(1), bytes(3000), 4096, channel)
    header, _raw, body = split_message(frames[0])
    forged = security_pb2.FrameHeader()
    forged.CopyFrom(header)
    forged.shape[0] = 5  # the header is authenticated data
    head = forged.SerializeToString()
    with pytest.raises(AuthenticationError) as tampered:
        opener.open(len(head).to_bytes(4, "little") + head + body)
    assert tampered.value.reason == "tampered"
    opener.open(frames[0])
    with pytest.raises(AuthenticationError) as replayed:
        opener.open(frames[0])
    assert replayed.value.reason == "replayed"
    plaintext = encode_frames(_header(2), bytes(10), 4096, None)
    with pytest.raises(AuthenticationError) as unencrypted:
        opener.open(plaintext[0])
    assert unencrypted.value.reason == "plaintext"


def test_a_chunk_without_its_start_is_refused() -> None:
    opener = FrameOpener(Security(None, CryptographyKem(), role="shard"), None)
    frames = encode_frames(_header(1), bytes(20_000), 4096, None)
    with pytest.raises(FrameError):
        FrameAssembler().add(*opener.open(frames[1]))
    with pytest.raises(FrameError):
        split_message(b"\xff\xff\xff\x00abc")


def test_activation_payload_round_trip() -> None:
    step = engine_pb2.StepBatch(step_id=9, finished_seq_ids=[1, 2])
    back, hidden = read_activation_payload(activation_payload(step, b"\x01\x02"))
    assert back == step and hidden == b"\x01\x02"
    with pytest.raises(FrameError):
        read_activation_payload(b"\xff\xff\x00\x00")


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
            SequenceStep(1, 0, (5, 6, 7), (0,), True, SequenceSpec(3, params, (9,), carry_key="req-1")),
            SequenceStep(2, 10, (8,), (), True),
        ),
        (0,),
    )
    message = step_batch_to_proto(batch, {1: Joining("req-1", [6, 7], b"k" * 32)}, with_token_ids=True)
    back, joining = step_batch_from_proto(engine_pb2.StepBatch.FromString(message.SerializeToString()))
    assert back == batch
    assert joining == {1: Joining("req-1", (6, 7), b"k" * 32)}
