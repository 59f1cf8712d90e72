"""Activation frames: a protobuf header and raw tensor bytes in one NATS payload, chunked to fit.

Layout of one message: a 4-byte little-endian header length, the `ActivationHeader`, then a slice
of the tensor's raw little-endian bytes. A frame whose tensor does not fit the server's
`max_payload` is cut into `num_chunks` messages that repeat the header with their `chunk_index`;
the receiver joins them in order. Core NATS delivers one publisher's messages to a subscriber in
order, so chunks of different steps never interleave.
"""

from __future__ import annotations

import struct

from mohawk_proto.v1 import bus_pb2

_LENGTH = struct.Struct("<I")
# Room kept for the NATS protocol line and headers beside our payload.
_PAYLOAD_MARGIN = 512


class FrameError(ValueError):
    """A malformed or out-of-order frame."""


def encode_frames(header: bus_pb2.ActivationHeader, data: bytes, max_payload: int) -> list[bytes]:
    """The messages that carry `data` under `header`, none longer than `max_payload`."""
    header.chunk_index = 0
    header.num_chunks = 1
    overhead = _LENGTH.size + header.ByteSize() + 16 + _PAYLOAD_MARGIN  # 16: room for chunk fields
    room = max_payload - overhead
    if room <= 0:
        raise FrameError(f"max_payload {max_payload} cannot hold a frame header of {overhead} bytes")
    num_chunks = max(1, -(-len(data) // room))
    messages = []
    for index in range(num_chunks):
        header.chunk_index = index
        header.num_chunks = num_chunks
        head = header.SerializeToString()
        messages.append(_LENGTH.pack(len(head)) + head + data[index * room : (index + 1) * room])
    return messages


def decode_frame(message: bytes) -> tuple[bus_pb2.ActivationHeader, bytes]:
    if len(message) < _LENGTH.size:
        raise FrameError("frame shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(message)
    end = _LENGTH.size + length
    if end > len(message):
        raise FrameError("frame header runs past the message")
    header = bus_pb2.ActivationHeader()
    header.ParseFromString(message[_LENGTH.size : end])
    return header, message[end:]


class FrameAssembler:
    """Joins the chunks of consecutive frames; `add` returns a whole frame once its last chunk is in."""

    def __init__(self) -> None:
        self._header: bus_pb2.ActivationHeader | None = None
        self._parts: list[bytes] = []

    def add(self, message: bytes) -> tuple[bus_pb2.ActivationHeader, bytes] | None:
        header, data = decode_frame(message)
        if header.num_chunks <= 1:
            self._header, self._parts = None, []
            return header, data
        if header.chunk_index == 0:
            self._header, self._parts = header, []
        elif self._header is None or header.step.step_id != self._header.step.step_id:
            raise FrameError(f"chunk {header.chunk_index} of step {header.step.step_id} without its start")
        if header.chunk_index != len(self._parts):
            raise FrameError(f"chunk {header.chunk_index} arrived after {len(self._parts)} chunks")
        self._parts.append(data)
        if len(self._parts) < header.num_chunks:
            return None
        whole = b"".join(self._parts)
        self._header, self._parts = None, []
        return header, whole
