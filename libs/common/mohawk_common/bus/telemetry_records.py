"""Telemetry reports on the bus, signed: what a shard node or gateway sends the telemetry service
(`mohawk_common.telemetry`) travels in a `TelemetryReport` signed by the sender's certificate
(`control_records`), so the dashboard shows no forged counts.

`seal_report` wraps a report's JSON for `sender` (unsigned where the sender runs insecure, as it
then signs nothing); `open_report` gives the JSON back once the signature verifies as `sender`'s
and the report's own id field names that sender too, else AuthenticationError (counted by the
reader). A reader with no trust root (insecure) accepts any well-formed report.
"""

from __future__ import annotations

from google.protobuf import json_format

from mohawk_common.bus.control import decode_json, encode_json
from mohawk_common.bus.control_records import RecordKind, RecordVerifier, sign_record
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.identity import Identity
from mohawk_proto.v1 import bus_pb2

STEP_REPORT: RecordKind = "step-report"
REQUEST_REPORT: RecordKind = "request-report"
_RECORD_KIND: dict[str, RecordKind] = {"step": STEP_REPORT, "req": REQUEST_REPORT}


def seal_report(kind: str, sender: str, body: str, identity: Identity | None) -> bytes:
    """The bytes to publish on `telemetry_subject(kind, sender)`: `body` (a report's JSON) in a
    `TelemetryReport`, signed by `identity` unless None."""
    record = bus_pb2.TelemetryReport(kind=kind, sender=sender, body=body)
    if identity is not None:
        sign_record(record, identity, _RECORD_KIND[kind])
    return encode_json(record)


def open_report(data: bytes, kind: str, verifier: RecordVerifier) -> bus_pb2.TelemetryReport:
    """The report in `data`, verified as a `kind` report of its sender; AuthenticationError when it
    does not parse (`malformed`), is of another kind, or its signature does not verify."""
    try:
        record = decode_json(bus_pb2.TelemetryReport, data)
    except (json_format.ParseError, ValueError) as exc:
        raise AuthenticationError("malformed", f"telemetry report: {exc}") from exc
    if record.kind != kind or kind not in _RECORD_KIND:
        raise AuthenticationError("malformed", f"a {record.kind!r} report where {kind!r} belongs")
    verifier.verify(record, _RECORD_KIND[kind])
    return record
