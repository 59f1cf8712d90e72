"""Control records (heartbeats, plans) as protobuf's canonical JSON, readable with the NATS CLI."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_proto.v1 import bus_pb2

M = TypeVar("M", bound=Message)


def encode_json(message: Message) -> bytes:
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None).encode()


def decode_json(cls: type[M], data: bytes) -> M:
    """Parse a control record; unknown fields are ignored so newer writers don't break older readers."""
    message = cls()
    json_format.Parse(data, message, ignore_unknown_fields=True)
    return message


async def read_plan(kv: KeyValue) -> bus_pb2.Plan | None:
    """The current plan, or None when the coordinator has not published one (or it was deleted)."""
    try:
        entry = await kv.get(names.PLAN_KEY)
    except KeyNotFoundError:
        return None
    if not entry.value:
        return None
    return decode_json(bus_pb2.Plan, entry.value)
