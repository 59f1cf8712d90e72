"""Frames between stages: an authenticated header, an encrypted body, chunked to fit NATS's max_payload.

Layout of one message: a 4-byte little-endian header length, the `FrameHeader` (channel, sequence
number, key epoch, plan version, receiving stage, step, dtype, shape, chunk, send time), then the
body: AES-256-GCM of one chunk of the frame's payload, with the header bytes exactly as sent as
associated data, so a changed header byte fails the tag like a changed body byte. In insecure
mode the header has no channel and the body is the plaintext chunk; a secure receiver rejects
such frames. A payload that does not fit `max_payload` is cut into `num_chunks` messages, each
sealed with its own sequence number; the receiver opens each and joins them in order. Core NATS
delivers one publisher's messages to a subscriber in order, so chunks of different steps never
interleave.

Payloads: kind 1 (activations) is a 4-byte length, a `StepBatch`, then the hidden states' raw
little-endian bytes; kind 2 (step result) is a `StepResult`; kind 3 (failed step) is kind 1's
layout with no tensor, passed on to the last stage, which answers stage 0 with an error result.
A secure receiver accepts each kind only from the stage that sends it (`positions.may_send`: the
channel names the sender), after the tag verifies; any other is refused and counted.
"""

from __future__ import annotations

import struct

from mohawk_common.bus.channels import ChannelManager, SecureChannel
from mohawk_common.bus.positions import KIND_ACTIVATIONS as KIND_ACTIVATIONS
from mohawk_common.bus.positions import KIND_FAILED as KIND_FAILED
from mohawk_common.bus.positions import KIND_RESULT as KIND_RESULT
from mohawk_common.bus.positions import may_send
from mohawk_common.bus.security import Security
from mohawk_pqc.errors import AuthenticationError
from mohawk_proto.v1 import bus_pb2, engine_pb2, security_pb2

_LENGTH = struct.Struct("<I")
_TAG_BYTES = 16
# Room kept for the NATS protocol line and headers beside our payload.
_PAYLOAD_MARGIN = 512


class FrameError(ValueError):
    """A malformed or out-of-order frame."""


def _max_header_bytes(header: security_pb2.FrameHeader) -> int:
    probe = security_pb2.FrameHeader()
    probe.CopyFrom(header)
    probe.channel_id = b"\xff" * 16
    probe.seq, probe.key_epoch = (1 << 64) - 1, (1 << 32) - 1
    probe.chunk_index = probe.num_chunks = (1 << 31) - 1
    return probe.ByteSize()


def encode_frames(
    header: security_pb2.FrameHeader, payload: bytes, max_payload: int, channel: SecureChannel | None
) -> list[bytes]:
    """The messages that carry `payload` under `header`, none longer than `max_payload`."""
    overhead = _LENGTH.size + _max_header_bytes(header) + _TAG_BYTES + _PAYLOAD_MARGIN
    room = max_payload - overhead
    if room <= 0:
        raise FrameError(f"max_payload {max_payload} cannot hold a frame header of {overhead} bytes")
    num_chunks = max(1, -(-len(payload) // room))
    messages = []
    for index in range(num_chunks):
        header.chunk_index = index
        header.num_chunks = num_chunks
        chunk = payload[index * room : (index + 1) * room]
        if channel is None:
            head = header.SerializeToString()
            body = chunk
        else:
            seq, epoch = channel.sender.next_seq()
            header.channel_id, header.seq, header.key_epoch = channel.channel_id, seq, epoch
            head = header.SerializeToString()
            body = channel.sender.encrypt(seq, epoch, head, chunk)
        messages.append(_LENGTH.pack(len(head)) + head + body)
    return messages


def split_message(message: bytes) -> tuple[security_pb2.FrameHeader, bytes, bytes]:
    """(header, its raw bytes, body) of one message; FrameError when it does not parse."""
    if len(message) < _LENGTH.size:
        raise FrameError("frame shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(message)
    end = _LENGTH.size + length
    if end > len(message):
        raise FrameError("frame header runs past the message")
    raw = message[_LENGTH.size : end]
    header = security_pb2.FrameHeader()
    try:
        header.ParseFromString(raw)
    except Exception as exc:
        raise FrameError("frame header does not parse") from exc
    return header, raw, message[end:]


class FrameOpener:
    """Opens messages on this node's channels: authenticated, de-duplicated, decrypted."""

    def __init__(self, security: Security, channels: ChannelManager | None) -> None:
        self.security, self.channels = security, channels

    def open(self, message: bytes) -> tuple[security_pb2.FrameHeader, bytes]:
        header, raw, body = split_message(message)
        if not header.channel_id:
            if self.security.secure:
                raise AuthenticationError("plaintext", f"unencrypted frame for stage {header.stage}")
            return header, body
        if self.channels is None:
            raise AuthenticationError("unknown_channel", "encrypted frame on an insecure node")
        channel = self.channels.receiving(header.channel_id)
        chunk = channel.receiver.decrypt(header.seq, header.key_epoch, raw, body)
        sender, receiver = self.channels.stage_of(channel.peer_id), self.channels.stage
        if not may_send(header.kind, sender, receiver, self.channels.num_stages):
            raise AuthenticationError(
                "out_of_position", f"frame kind {header.kind} from stage {sender} to stage {receiver}"
            )
        return header, chunk


class FrameAssembler:
    """Joins the chunks of consecutive frames; `add` returns a whole frame once its last chunk is in."""

    def __init__(self) -> None:
        self._header: security_pb2.FrameHeader | None = None
        self._parts: list[bytes] = []

    def add(
        self, header: security_pb2.FrameHeader, chunk: bytes
    ) -> tuple[security_pb2.FrameHeader, bytes] | None:
        if header.num_chunks <= 1:
            self._header, self._parts = None, []
            return header, chunk
        if header.chunk_index == 0:
            self._header, self._parts = header, []
        elif self._header is None or header.step_id != self._header.step_id:
            raise FrameError(f"chunk {header.chunk_index} of step {header.step_id} without its start")
        if header.chunk_index != len(self._parts):
            raise FrameError(f"chunk {header.chunk_index} arrived after {len(self._parts)} chunks")
        self._parts.append(chunk)
        if len(self._parts) < header.num_chunks:
            return None
        whole = b"".join(self._parts)
        self._header, self._parts = None, []
        return header, whole


def activation_payload(step: engine_pb2.StepBatch, hidden: bytes) -> bytes:
    head = step.SerializeToString()
    return _LENGTH.pack(len(head)) + head + hidden


def read_activation_payload(payload: bytes) -> tuple[engine_pb2.StepBatch, bytes]:
    if len(payload) < _LENGTH.size:
        raise FrameError("activation payload shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(payload)
    end = _LENGTH.size + length
    if end > len(payload):
        raise FrameError("step batch runs past the payload")
    step = engine_pb2.StepBatch()
    try:
        step.ParseFromString(payload[_LENGTH.size : end])
    except Exception as exc:
        raise FrameError("step batch does not parse") from exc
    return step, payload[end:]


def read_result_payload(payload: bytes) -> bus_pb2.StepResult:
    try:
        return bus_pb2.StepResult.FromString(payload)
    except Exception as exc:
        raise FrameError("step result does not parse") from exc
