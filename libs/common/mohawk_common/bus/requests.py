"""Requests on the durable stream: sealed by the gateway so that only the model's shard nodes can open them.

The gateway puts a fresh 32-byte token key into the `GenerateRequest`, seals the request to the
model's request-sealing certificate (`mohawk_pqc.seal`: X25519 + ML-KEM-768, AES-256-GCM, the
request id and model as associated data) and signs the whole `SealedRequest` with its own certified
key. Stage 0 checks the gateway's certificate (role gateway, not expired, not revoked, and when it
is bound to a model, bound to this one) and its signature before it opens anything. The token key
then travels inside the encrypted frames to the last stage, which encrypts every token event with
it; the gateway decrypts them, and a stage 0 that takes over the request after a recovery reads the
emitted events back with the same key. A cancel carries an HMAC under the token key, so only the
requester can cancel. The sealing key rotates when a shard node is revoked
(`mohawk_pqc.seal_keys`): the gateway seals to the newest certificate it holds, and stage 0 opens
with the key the envelope names: the newest, or for `SEALED_REQUEST_LIFETIME_S` after the rotation
the one before it.

The stream stores a request id once within its duplicate window (`DUPLICATE_WINDOW_S`); a
recorded request published again later would be stored anew, so stage 0 refuses at admission
(`check_fresh`, reason stale) a request that entered the stream more than the window after it was
made (its `created` lies inside the sealed, signed request), and one whose deadline has passed.
The time it entered the stream is the server's stamp on the stream message, which a redelivery
keeps, so a request taken over after a failure is not refused for having run long.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import DUPLICATE_WINDOW_S
from mohawk_pqc.certificates import check_model, read_body
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.seal import open_sealed, seal
from mohawk_pqc.signing import VerifyKey
from mohawk_proto.v1 import bus_pb2, security_pb2

M = TypeVar("M", bound=Message)

SEALED_HEADER = "Mohawk-Sealed"
TOKEN_KEY_BYTES = 32
_REQUEST_LABEL = b"sealed-request"


def _aad(request_id: str, model: str) -> bytes:
    return f"mohawk/v1 request {request_id} {model}".encode()


def new_token_key() -> bytes:
    return os.urandom(TOKEN_KEY_BYTES)


def cancel_tag(token_key: bytes, request_id: str) -> bytes:
    return hmac.new(token_key, b"mohawk/v1 cancel " + request_id.encode(), hashlib.sha256).digest()


def seal_request(request: bus_pb2.GenerateRequest, security: Security) -> tuple[bytes, dict[str, str]]:
    """The bytes (and NATS headers) to publish for `request`: sealed and signed when secure."""
    headers = {"Nats-Msg-Id": request.request_id}
    bundle = security.bundle
    if bundle is None:
        return request.SerializeToString(), headers
    seal_cert = bundle.seal_cert_for(request.model)
    if seal_cert is None:
        raise AuthenticationError(
            "untrusted", f"this gateway has no sealing certificate for {request.model!r}"
        )
    envelope = seal(
        read_body(seal_cert),
        request.SerializeToString(),
        _aad(request.request_id, request.model),
        security.kem,
    )
    sealed = security_pb2.SealedRequest(
        request_id=request.request_id,
        model=request.model,
        sender=bundle.identity.certificate,
        envelope=envelope,
    )
    signed = sealed.SerializeToString(deterministic=True)
    sealed.signature.CopyFrom(bundle.identity.signing_key.sign(_REQUEST_LABEL, signed))
    return sealed.SerializeToString(), {**headers, SEALED_HEADER: "1"}


def open_request(
    data: bytes, headers: dict[str, str] | None, security: Security, model: str
) -> bus_pb2.GenerateRequest:
    """The request in a stream message; AuthenticationError when it is not what this node accepts."""
    sealed_header = bool((headers or {}).get(SEALED_HEADER))
    bundle = security.bundle
    if bundle is None:
        if sealed_header:
            raise AuthenticationError("untrusted", "a sealed request reached a node with no certificate")
        return _parse(bus_pb2.GenerateRequest, data)
    if not sealed_header:
        raise AuthenticationError("plaintext", "unsealed request on a secure cluster")
    sealed = _parse(security_pb2.SealedRequest, data)
    sender = bundle.trust.verify(sealed.sender, role="gateway")
    check_model(sender, model)  # a gateway certificate bound to another model sends it nothing
    signature = security_pb2.HybridSignature()
    signature.CopyFrom(sealed.signature)
    sealed.ClearField("signature")
    VerifyKey(sender.ecdsa_p256_public, sender.mldsa65_public).verify(
        _REQUEST_LABEL, sealed.SerializeToString(deterministic=True), signature
    )
    keyring = bundle.seal_keyring_for(model)
    if keyring is None or keyring.keys is None:
        raise AuthenticationError("untrusted", f"this node holds no sealing key for {model!r}")
    keys = keyring.key_for(sealed.envelope.recipient_serial, security.clock())
    if keys is None:  # sealed to a key this node was never given, or one rotated out long enough ago
        raise AuthenticationError(
            "untrusted", f"no sealing key {sealed.envelope.recipient_serial} of {model!r} held"
        )
    plaintext = open_sealed(keys, sealed.envelope, _aad(sealed.request_id, sealed.model))
    request = _parse(bus_pb2.GenerateRequest, plaintext)
    if request.request_id != sealed.request_id or request.model != sealed.model:
        raise AuthenticationError("tampered", "sealed request ids disagree")
    if len(request.token_key) != TOKEN_KEY_BYTES:
        raise AuthenticationError("malformed", "sealed request without a token key")
    return request


def check_fresh(
    request: bus_pb2.GenerateRequest, *, stored_at: float, now: float, window_s: float = DUPLICATE_WINDOW_S
) -> None:
    """AuthenticationError (stale) when `request` entered the stream (`stored_at`, the server's
    stamp, unix seconds) more than the duplicate window after it was created, or its deadline has
    passed `now`: a re-publication the stream's dedupe no longer catches, or nobody waits for it."""
    if request.created and stored_at - request.created > window_s:
        raise AuthenticationError(
            "stale", f"request made {stored_at - request.created:.0f} s before it entered the stream"
        )
    if request.deadline and now > request.deadline:
        raise AuthenticationError("stale", f"request deadline passed {now - request.deadline:.0f} s ago")


def _parse(cls: type[M], data: bytes) -> M:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise AuthenticationError("malformed", cls.__name__) from exc
