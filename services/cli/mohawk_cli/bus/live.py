"""`mohawk bus sub SUBJECT`: every message on a subject as it passes, described, never opened.

What travels between Mohawk's services is encrypted (stage frames on per-channel AES-GCM keys,
requests sealed to stage 0, token events under each request's key), so the inspector shows what is
in the clear: each message's subject, size and NATS headers, and whom it is from:
- activation frames and step results: the frame header (plan, stage, step, chunk, kind, channel);
  once the inspector has seen a channel's handshake it names the two nodes of that channel;
- handshake offers: the initiator's certificate (node id, role, serial) and the node it means to reach;
- requests: the sealing gateway's certificate, and the model;
- heartbeats (plain JSON by design): the node, its stage and plan version.
Certificates are shown as claimed; checking them takes the trust root, which only the nodes hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.msg import Msg

from mohawk_cli.bus.jetstream import connected, human_bytes
from mohawk_common.bus import names
from mohawk_common.bus.connect import server_has_all
from mohawk_common.bus.frames import KIND_ACTIVATIONS, KIND_FAILED, KIND_RESULT, FrameError, split_message
from mohawk_common.bus.requests import SEALED_HEADER
from mohawk_proto.v1 import engine_pb2, security_pb2

ENCRYPTED = "payload encrypted (not shown)"
_FRAME_KINDS = {KIND_ACTIVATIONS: "activations", KIND_RESULT: "step result", KIND_FAILED: "failed step"}


@dataclass
class Describer:
    """Turns messages into one-line descriptions; remembers channels from the handshakes it saw."""

    channels: dict[bytes, str] = field(default_factory=dict)  # channel id -> "initiator -> responder"

    def describe(self, subject: str, data: bytes, headers: dict[str, str] | None) -> str:
        kind = subject.removeprefix(f"{names.PREFIX}.").split(".", 1)[0]
        details = {
            "act": self._frame,
            "hs": self._handshake,
            "req": self._request,
            "hb": self._heartbeat,
            "tok": lambda d, h: self._token(subject, d),
            "cancel": lambda d, h: "cancel (tagged with the request's key)" if d else "cancel",
        }.get(kind)
        text = details(data, headers) if details is not None else "not a Mohawk subject"
        shown = {k: v for k, v in (headers or {}).items()}
        extra = f"  headers {json.dumps(shown)}" if shown else ""
        return f"{time.strftime('%H:%M:%S')} {subject} {human_bytes(len(data))}  {text}{extra}"

    def _frame(self, data: bytes, headers: dict[str, str] | None) -> str:
        try:
            header, _raw, _body = split_message(data)
        except FrameError as exc:
            return f"unreadable frame ({exc})"
        kind = _FRAME_KINDS.get(header.kind, f"kind {header.kind}")
        where = f"plan {header.plan_version} stage {header.stage} step {header.step_id}"
        chunk = f" chunk {header.chunk_index + 1}/{header.num_chunks}" if header.num_chunks > 1 else ""
        if not header.channel_id:
            return f"{kind}, {where}{chunk}; PLAINTEXT (insecure bus)"
        peers = self.channels.get(header.channel_id, f"channel {header.channel_id.hex()[:12]}")
        return f"{kind}, {where}{chunk}, {peers}; {ENCRYPTED}"

    def _handshake(self, data: bytes, headers: dict[str, str] | None) -> str:
        step = (headers or {}).get("Mohawk-Handshake", "")
        if step == "init":
            try:
                offer = security_pb2.HandshakeInit.FromString(data)
                body = security_pb2.CertificateBody.FromString(offer.certificate.body)
            except Exception:
                return "handshake offer (unreadable)"
            self.channels[offer.channel_id] = f"{body.node_id} -> {offer.responder_id}"
            return (
                f"handshake offer from {body.node_id} ({body.role}, certificate serial {body.serial}) "
                f"to {offer.responder_id}, plan {offer.plan_version}"
            )
        if step == "finish":
            return "handshake finish"
        try:
            reply = security_pb2.HandshakeReply.FromString(data)
        except Exception:
            return "handshake message"
        return "handshake reply: REFUSED" if reply.refused else "handshake reply"

    def _request(self, data: bytes, headers: dict[str, str] | None) -> str:
        if not (headers or {}).get(SEALED_HEADER):
            return "request; PLAINTEXT (insecure bus)"
        try:
            sealed = security_pb2.SealedRequest.FromString(data)
            body = security_pb2.CertificateBody.FromString(sealed.sender.body)
        except Exception:
            return "sealed request (unreadable)"
        return (
            f"request {sealed.request_id} for {sealed.model}, sealed by {body.node_id} "
            f"({body.role}, certificate serial {body.serial}); {ENCRYPTED}"
        )

    def _token(self, subject: str, data: bytes) -> str:
        request_id = subject.rsplit(".", 1)[-1]
        try:
            event = engine_pb2.TokenEvent.FromString(data)
        except Exception:
            event = None
        if event is not None and event.request_id == request_id:
            return f"token event {event.index}; PLAINTEXT (insecure bus)"
        return f"token event; {ENCRYPTED}"

    def _heartbeat(self, data: bytes, headers: dict[str, str] | None) -> str:
        try:
            beat = json.loads(data)
        except ValueError:
            return "heartbeat (unreadable)"
        node, stage, plan = beat.get("node_id", "?"), beat.get("stage", 0), beat.get("plan_version", 0)
        loaded = "loaded" if beat.get("loaded") else "not loaded"
        return f"heartbeat from {node} ({beat.get('role', '?')}): stage {stage}, plan {plan}, {loaded}"


async def watch(
    nats_url: str, subject: str, *, count: int = 0, timeout_s: float = 0.0, creds: Path | None = None
) -> int:
    """Print every message on `subject` until `count` messages or `timeout_s` (0: no limit)."""
    describer = Describer()
    seen = 0
    done = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        nonlocal seen
        print(describer.describe(msg.subject, msg.data, msg.headers), flush=True)
        seen += 1
        if count and seen >= count:
            done.set()

    async def learn(msg: Msg) -> None:
        describer.describe(msg.subject, msg.data, msg.headers)

    async with connected(nats_url, creds) as nc:
        await nc.subscribe(subject, cb=on_message)
        # handshakes name the channels the frames travel on: watch them too (shown only if asked for)
        if not subject.startswith(f"{names.PREFIX}.hs."):
            await nc.subscribe(f"{names.PREFIX}.hs.*", cb=learn)
        await server_has_all(nc)  # "watching" is true only once the server has the subscriptions
        print(
            f"watching {subject}: payloads between services are encrypted, so only sizes, headers "
            "and senders are shown",
            flush=True,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s or None)
    return 0
