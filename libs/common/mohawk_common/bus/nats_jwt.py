"""NATS's decentralised identities, minted here: NKeys and the operator, account and user JWTs
nats-server resolves (the claims `nsc` writes; ed25519 NKeys from the `nkeys` package).

Design. The operator's key signs the account's JWT, the account's key signs each user's JWT,
and a server trusts only the operator's JWT in its config. A user JWT names that user's own
publish and subscribe allow lists; the server checks a connecting client's signature over its
nonce with the user's key (the `.creds` file holds the JWT and the seed) and enforces the lists.
A user is revoked by the account: its public key goes into the account JWT's `revocations` (the
time it was revoked: any JWT of that user issued up to then is refused), and the re-signed
account JWT is pushed to the servers (`$SYS.REQ.CLAIMS.UPDATE`, from a user of the system
account), which drop that user's connections at once. Claims are JSON, encoded as nats-io/jwt v2
does: base64url without padding, `header.claims.signature`, the signature ed25519 over the first
two parts, `jti` a hash of the claims.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

JWT_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
CLAIMS_VERSION = 2
UNLIMITED = -1
UPDATE_SUBJECT = "$SYS.REQ.CLAIMS.UPDATE"  # a full resolver takes a newer account JWT published here

_PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}


@dataclass(frozen=True, slots=True)
class NKey:
    """One ed25519 NKey: its seed (S..., secret) and public key (O..., A..., U...)."""

    seed: str

    @classmethod
    def create(cls, kind: str) -> NKey:
        raw = os.urandom(32)
        return cls(nkeys.encode_seed(raw, _PREFIXES[kind]).decode())

    @property
    def public_key(self) -> str:
        return str(nkeys.from_seed(self.seed.encode()).public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(self.seed.encode()).sign(data))


@dataclass(frozen=True, slots=True)
class UserPermissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may reply (once, to the reply subject) to requests it received


def operator_jwt(operator: NKey, *, name: str, system_account: str) -> str:
    return encode(
        operator,
        subject=operator.public_key,
        name=name,
        nats={"type": "operator", "system_account": system_account},
    )


def account_jwt(
    operator: NKey,
    account_public_key: str,
    *,
    name: str,
    revocations: dict[str, int] | None = None,
    jetstream: bool = True,
) -> str:
    """The account's JWT, signed by the operator; `revocations`: user public key -> unix time."""
    limits: dict[str, Any] = {
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
        "imports": UNLIMITED,
        "exports": UNLIMITED,
        "wildcards": True,
        "conn": UNLIMITED,
        "leaf": UNLIMITED,
    }
    if jetstream:
        limits.update(mem_storage=UNLIMITED, disk_storage=UNLIMITED, streams=UNLIMITED, consumer=UNLIMITED)
    nats: dict[str, Any] = {"type": "account", "limits": limits}
    if revocations:
        nats["revocations"] = dict(sorted(revocations.items()))
    return encode(operator, subject=account_public_key, name=name, nats=nats)


def user_jwt(
    account: NKey, user_public_key: str, *, name: str, permissions: UserPermissions, expires_at: int | None
) -> str:
    """A user's JWT, signed by its account, allowing exactly `permissions` (None: never expires)."""
    nats: dict[str, Any] = {
        "type": "user",
        "pub": {"allow": list(dict.fromkeys(permissions.publish))},
        "sub": {"allow": list(dict.fromkeys(permissions.subscribe))},
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
    }
    if permissions.allow_responses:
        nats["resp"] = {"max": 1, "ttl": 0}
    return encode(account, subject=user_public_key, name=name, nats=nats, expires_at=expires_at)


def encode(
    issuer: NKey, *, subject: str, name: str, nats: dict[str, Any], expires_at: int | None = None
) -> str:
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public_key,
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": CLAIMS_VERSION},
    }
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    claims["jti"] = _b32(hashlib.sha256(_json(claims)).digest())
    signing_input = f"{_b64(_json(JWT_HEADER))}.{_b64(_json(claims))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode_claims(token: str) -> dict[str, Any]:
    """A JWT's claims (not verified: for reading back what this module wrote)."""
    part = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    if not isinstance(claims, dict):
        raise ValueError("a JWT's claims must be an object")
    return claims


def verify(token: str, issuer_public_key: str) -> dict[str, Any]:
    """A JWT's claims once its signature verifies under `issuer_public_key` (ValueError if not)."""
    signing_input, _, signature = token.rpartition(".")
    claims = decode_claims(token)
    try:
        raw = base64.b32decode(issuer_public_key + "=" * (-len(issuer_public_key) % 8))[1:33]
        nacl.signing.VerifyKey(raw).verify(
            signing_input.encode(), base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        )
    except (nacl.exceptions.BadSignatureError, ValueError, binascii.Error) as exc:
        raise ValueError(f"JWT not signed by {issuer_public_key}") from exc
    if claims.get("iss") != issuer_public_key:
        raise ValueError(f"JWT issued by {claims.get('iss')}, not {issuer_public_key}")
    return claims


def creds_text(token: str, user: NKey) -> str:
    """A `.creds` file (what nats-py's `user_credentials` and the NATS CLI's `--creds` read)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{token}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def creds_jwt(text: str) -> str:
    """The user JWT of a `.creds` file's text."""
    lines = [line.strip() for line in text.splitlines()]
    try:
        return lines[lines.index("-----BEGIN NATS USER JWT-----") + 1]
    except (ValueError, IndexError):
        raise ValueError("not a NATS .creds file (no user JWT)") from None


def creds_name(text: str) -> str:
    """The user name in a `.creds` file's text (a process's id: its inbox prefix)."""
    return str(decode_claims(creds_jwt(text))["name"])


def creds_subscriptions(text: str) -> list[str]:
    """The subjects a `.creds` file's user may subscribe to (its JWT's allow list)."""
    return [str(subject) for subject in decode_claims(creds_jwt(text))["nats"]["sub"]["allow"]]


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b32(data: bytes) -> str:
    return base64.b32encode(data).rstrip(b"=").decode()
