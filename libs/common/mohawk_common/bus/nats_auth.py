"""Who may do what on the bus: one NATS user per role, each with least-privilege permissions that
nats-server enforces (server-config users: `authorization { users = [...] }`).

`init_auth(dir)` makes, once, a random password per role and writes

    <dir>/nats-auth.conf           the server's `authorization {}` block: bcrypt hashes and each
                                   role's publish/subscribe allow lists (include it from the server
                                   config; anonymous clients are refused, there is no no_auth_user)
    <dir>/creds/<role>.creds       one client credential per role, JSON {"user", "password"}, 0600

Roles and what they may do (every subject and bucket from `names`):

    coordinator  read heartbeats; write the leader lease, node registry and plan; NAK requests a
                 lost stage 0 held
    shard        publish heartbeats, frames, tokens, handshakes, telemetry; pull and ack requests;
                 read the plan, CRL, gateway presence and slices; never write the plan
    gateway      publish requests and cancels; read tokens and heartbeats; keep its presence; read
                 the plan and CRL; never write the plan, purge or delete a stream
    telemetry    read heartbeats, telemetry reports, plan and leader
    ops          `mohawk bus`: read every stream, consumer, bucket and subject; publish nothing
    admin        `mohawk pki revoke` and `mohawk slice push`: ops, plus writing the CRL and slices

Every role but ops may create (never update, purge or delete) Mohawk's own streams and buckets,
as each service does at start (`setup.ensure_streams`/`ensure_buckets`): a create with an
existing name and another configuration is refused by JetStream, so it changes nothing.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from mohawk_common.bus import names

ROLES = ("coordinator", "shard", "gateway", "telemetry", "ops", "admin")
CONF_NAME = "nats-auth.conf"
CREDS_DIR = "creds"
USER_PREFIX = "mohawk-"
BCRYPT_COST = 11  # nats-server's own `nats server passwd` default
_API = "$JS.API"
_INBOX = "_INBOX.>"


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may reply to requests it received (handshake responders)


@dataclass(frozen=True, slots=True)
class Credential:
    user: str
    password: str

    @classmethod
    def read(cls, path: Path) -> Credential:
        data = json.loads(Path(path).read_text())
        return cls(user=str(data["user"]), password=str(data["password"]))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(path, json.dumps({"user": self.user, "password": self.password}))


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """A directory `init_auth` filled: the server's include file and one credential per role."""

    dir: Path

    @property
    def conf(self) -> Path:
        return self.dir / CONF_NAME

    def creds(self, role: str) -> Path:
        if role not in ROLES:
            raise ValueError(f"unknown NATS role {role!r}; one of {', '.join(ROLES)}")
        return self.dir / CREDS_DIR / f"{role}.creds"


def init_auth(directory: Path) -> NatsAuth:
    """Credentials for every role under `directory` (kept if there already) and the server's
    include file for them (rewritten each time, so permission changes reach it)."""
    auth = NatsAuth(Path(directory))
    credentials: dict[str, Credential] = {}
    for role in ROLES:
        path = auth.creds(role)
        if path.is_file() and not path.is_symlink():
            credentials[role] = Credential.read(path)
        else:
            credentials[role] = Credential(USER_PREFIX + role, secrets.token_urlsafe(32))
            credentials[role].write(path)
    _write_private(auth.conf, authorization_block(credentials))
    return auth


def _write_private(path: Path, text: str) -> None:
    """A new 0600 file whatever was there (a leftover file's mode, a planted link) and the umask."""
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def authorization_block(credentials: Mapping[str, Credential]) -> str:
    """nats-server's `authorization {}` for `credentials` (role -> credential), passwords hashed."""
    users = []
    for role, credential in credentials.items():
        rules = role_permissions(role)
        hashed = bcrypt.hashpw(credential.password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()
        users.append(
            "    {\n"
            f"      user: {_quote(credential.user)}\n"
            f"      password: {_quote(hashed)}\n"
            "      permissions: {\n"
            f"        publish: {{ allow: {_list(rules.publish)} }}\n"
            f"        subscribe: {{ allow: {_list(rules.subscribe)} }}\n"
            + ("        allow_responses: true\n" if rules.allow_responses else "")
            + "      }\n"
            "    }"
        )
    return (
        "# Generated by `mohawk nats-auth init` / `mohawk up`: one user per Mohawk role (bcrypt\n"
        "# hashes; the clients' passwords are in creds/<role>.creds beside this file).\n"
        "authorization {\n  users = [\n" + "\n".join(users) + "\n  ]\n}\n"
    )


def role_permissions(role: str) -> Permissions:
    if role not in _ROLE_RULES:
        raise ValueError(f"unknown NATS role {role!r}; one of {', '.join(ROLES)}")
    return _ROLE_RULES[role]()


def _coordinator() -> Permissions:
    return Permissions(
        publish=(
            *_adopt(),
            *_kv_read(names.LEADER_BUCKET, names.NODES_BUCKET, names.PLAN_BUCKET, names.PKI_BUCKET),
            *_kv_read(names.GATEWAYS_BUCKET),
            *_kv_write(names.LEADER_BUCKET, names.NODES_BUCKET, names.PLAN_BUCKET),
            f"$JS.ACK.{names.REQUESTS_STREAM}.>",  # NAK what a lost stage 0 held
        ),
        subscribe=(names.HEARTBEAT_WILDCARD, _INBOX),
    )


def _shard() -> Permissions:
    requests = names.REQUESTS_STREAM
    return Permissions(
        publish=(
            *_adopt(),
            f"{names.PREFIX}.hb.*",
            f"{names.PREFIX}.act.>",
            names.TOKENS_WILDCARD,
            f"{names.PREFIX}.hs.*",
            names.TELEMETRY_WILDCARD,
            # stage 0: the shared and routed pull consumers of the requests stream
            f"{_API}.CONSUMER.CREATE.{requests}.>",
            f"{_API}.CONSUMER.DURABLE.CREATE.{requests}.*",
            f"{_API}.CONSUMER.INFO.{requests}.*",
            f"{_API}.CONSUMER.LIST.{requests}",
            f"{_API}.CONSUMER.NAMES.{requests}",
            f"{_API}.CONSUMER.MSG.NEXT.{requests}.*",
            f"$JS.ACK.{requests}.>",
            *_stream_read(names.TOKENS_STREAM),  # a new stage 0 reads back emitted tokens
            *_kv_read(names.PLAN_BUCKET, names.PKI_BUCKET, names.GATEWAYS_BUCKET, names.NODES_BUCKET),
            *_kv_read(names.LEADER_BUCKET),
            *_object_read(names.SLICES_BUCKET),
        ),
        subscribe=(f"{names.PREFIX}.act.>", names.CANCEL_WILDCARD, f"{names.PREFIX}.hs.*", _INBOX),
        allow_responses=True,  # handshake replies
    )


def _gateway() -> Permissions:
    return Permissions(
        publish=(
            *_adopt(),
            names.REQUESTS_WILDCARD,
            names.CANCEL_WILDCARD,
            names.TELEMETRY_WILDCARD,
            *_stream_read(names.TOKENS_STREAM),
            *_kv_read(names.PLAN_BUCKET, names.PKI_BUCKET, names.GATEWAYS_BUCKET, names.NODES_BUCKET),
            *_kv_read(names.LEADER_BUCKET),
            *_kv_write(names.GATEWAYS_BUCKET),
        ),
        subscribe=(names.TOKENS_WILDCARD, names.HEARTBEAT_WILDCARD, _INBOX),  # readiness: live nodes
    )


def _telemetry() -> Permissions:
    return Permissions(
        publish=(*_adopt(), *_kv_read(*_BUCKETS)),
        subscribe=(names.HEARTBEAT_WILDCARD, names.TELEMETRY_WILDCARD, _INBOX),
    )


def _ops() -> Permissions:
    return Permissions(
        publish=(
            f"{_API}.INFO",
            f"{_API}.STREAM.NAMES",
            f"{_API}.STREAM.LIST",
            f"{_API}.STREAM.INFO.*",
            f"{_API}.CONSUMER.NAMES.*",
            f"{_API}.CONSUMER.LIST.*",
            f"{_API}.CONSUMER.INFO.*.*",
            *_kv_read(*_BUCKETS),
        ),
        subscribe=(f"{names.PREFIX}.>", _INBOX),
    )


def _admin() -> Permissions:
    ops = _ops()
    slices = _object_stream(names.SLICES_BUCKET)
    return Permissions(
        publish=(
            *ops.publish,
            *_adopt(),  # `pki revoke` adopts every bucket, as a service does
            *_kv_write(names.PKI_BUCKET),
            *_object_read(names.SLICES_BUCKET),
            f"{_API}.STREAM.CREATE.{slices}",
            f"{_API}.STREAM.PURGE.{slices}",  # replacing an object purges its old chunks
            f"$O.{names.SLICES_BUCKET}.>",
        ),
        subscribe=ops.subscribe,
    )


_BUCKETS = (
    names.LEADER_BUCKET,
    names.NODES_BUCKET,
    names.PLAN_BUCKET,
    names.PKI_BUCKET,
    names.GATEWAYS_BUCKET,
)
_ROLE_RULES = {
    "coordinator": _coordinator,
    "shard": _shard,
    "gateway": _gateway,
    "telemetry": _telemetry,
    "ops": _ops,
    "admin": _admin,
}


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _object_stream(bucket: str) -> str:
    return f"OBJ_{bucket}"


def _adopt() -> tuple[str, ...]:
    """Finding, else creating, Mohawk's streams and KV buckets (what every service does at start)."""
    streams = (names.REQUESTS_STREAM, names.TOKENS_STREAM, *(_kv_stream(b) for b in _BUCKETS))
    return tuple(f"{_API}.STREAM.{verb}.{stream}" for stream in streams for verb in ("INFO", "CREATE"))


def _stream_read(stream: str) -> tuple[str, ...]:
    """Reading `stream`: its info, single messages, and ordered consumers (watchers) with their
    flow control."""
    return (
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.STREAM.MSG.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.>",
        f"{_API}.CONSUMER.CREATE.{stream}",
        f"{_API}.CONSUMER.CREATE.{stream}.>",
        f"{_API}.CONSUMER.INFO.{stream}.*",
        f"{_API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    )


def _kv_read(*buckets: str) -> tuple[str, ...]:
    return tuple(subject for bucket in buckets for subject in _stream_read(_kv_stream(bucket)))


def _kv_write(*buckets: str) -> tuple[str, ...]:
    return tuple(f"$KV.{bucket}.>" for bucket in buckets)


def _object_read(bucket: str) -> tuple[str, ...]:
    # nats-py finds an object's chunk stream by subject (STREAM.NAMES) before reading it
    return (*_stream_read(_object_stream(bucket)), f"{_API}.STREAM.NAMES")


def _quote(text: str) -> str:
    return json.dumps(text)


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(item) for item in dict.fromkeys(items)) + "]"
