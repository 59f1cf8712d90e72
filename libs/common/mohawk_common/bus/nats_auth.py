"""Who may do what on the bus: one NATS user per process, each allowed only its own subjects
(`nats_permissions`), in NATS's decentralised auth (`nats_jwt`: an operator, an account, users).

`init_auth(dir)` makes, once, the operator, the `MOHAWK` account and the system account (their
NKey seeds under `keys/`, 0600), and writes

    <dir>/nats-auth.conf           what nats-server includes: the operator's JWT, the system
                                   account, and both accounts' JWTs preloaded (the MOHAWK one with
                                   its revocations); the server's config adds the resolver
                                   (`resolver_block`: a full resolver, which takes pushed updates)
    <dir>/account.jwt              the account's newest JWT (its revocation list); beside it the
                                   operator's and the system account's (operator.jwt, system.jwt)
    <dir>/users.json               every user issued: name, role, public key, certificate serial
    <dir>/creds/{ops,admin,system}.creds
                                   a person's tools: `mohawk bus` (ops), `mohawk pki revoke` and
                                   `slice push` (admin), pushing account updates (system)
    <dir>/creds/events.creds       the coordinators' ear on the servers: a system-account user
                                   that may only hear the MOHAWK account's connect and disconnect
                                   advisories (`connection_events`), so a node whose connection
                                   closes is known at once

`issue_user(auth, name, role, path, ...)` writes one process's `.creds` (JWT and seed; what
nats-py and the NATS CLI read), scoped to that process. `revoke_users` adds users to the account's
revocations and re-signs it; `push_account` hands the JWT to running servers, which drop the
revoked users' connections and refuse them from then on. Anonymous clients are
refused: a server with an operator admits only users its accounts signed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError

from mohawk_common.bus.connect import connect_or_give_up
from mohawk_common.bus.nats_jwt import (
    UPDATE_SUBJECT,
    NKey,
    UserPermissions,
    account_jwt,
    creds_text,
    operator_jwt,
    user_jwt,
    verify,
)
from mohawk_common.bus.nats_permissions import process_permissions
from mohawk_common.private_files import write_new

CONF_NAME = "nats-auth.conf"
CREDS_DIR = "creds"
KEYS_DIR = "keys"
LEDGER_NAME = "users.json"
ACCOUNT_JWT_NAME = "account.jwt"
OPERATOR_JWT_NAME = "operator.jwt"
SYSTEM_JWT_NAME = "system.jwt"
ACCOUNT_NAME = "MOHAWK"
SYSTEM_ACCOUNT_NAME = "SYS"
TOOL_USERS = ("ops", "admin")  # people's tools, one user each; processes get their own
SYSTEM_USER = "system"
EVENTS_USER = "events"
SYSTEM_REQUESTS = "$SYS.REQ.>"  # servers' own reports (CONNZ, VARZ, JSZ) to the system account
# a shard node's JWT names its model's stage-0 consumers one by one (about 16 KB), and a client
# sends its JWT in its CONNECT line: nats-server's default 4 KB would refuse it
MAX_CONTROL_LINE = 64 * 1024


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """A directory `init_auth` filled: the keys, the server's include file, the users issued."""

    dir: Path

    @property
    def conf(self) -> Path:
        return self.dir / CONF_NAME

    @property
    def ledger(self) -> Path:
        return self.dir / LEDGER_NAME

    @property
    def account_jwt(self) -> Path:
        return self.dir / ACCOUNT_JWT_NAME

    def creds(self, name: str) -> Path:
        """The `.creds` of a tool user (ops, admin, system) or of a process issued under `creds/`."""
        return self.dir / CREDS_DIR / f"{name}.creds"

    def key(self, kind: str) -> NKey:
        return NKey((self.dir / KEYS_DIR / f"{kind}.nk").read_text().strip())

    def users(self) -> list[dict[str, Any]]:
        """Every user issued, in order: {name, role, public_key, serial, issued_at}."""
        if not self.ledger.is_file():
            return []
        users = json.loads(self.ledger.read_text())
        return list(users) if isinstance(users, list) else []

    def revocations(self) -> dict[str, int]:
        """The account's revoked users (public key -> when), from its newest JWT."""
        if not self.account_jwt.is_file():
            return {}
        claims = verify(self.account_jwt.read_text().strip(), self.key("operator").public_key)
        return {str(k): int(v) for k, v in claims["nats"].get("revocations", {}).items()}


def init_auth(directory: Path) -> NatsAuth:
    """The operator, accounts and tool users under `directory` (kept if there already), and the
    server's include file for them (rewritten each time)."""
    auth = NatsAuth(Path(directory))
    (auth.dir / KEYS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
    for kind, prefix in (("operator", "operator"), ("account", "account"), ("system", "account")):
        path = auth.dir / KEYS_DIR / f"{kind}.nk"
        if not path.is_file() or path.is_symlink():
            _write_private(path, NKey.create(prefix).seed)
    operator, system = auth.key("operator"), auth.key("system")
    claims = {
        OPERATOR_JWT_NAME: lambda: operator_jwt(operator, name="mohawk", system_account=system.public_key),
        SYSTEM_JWT_NAME: lambda: account_jwt(
            operator, system.public_key, name=SYSTEM_ACCOUNT_NAME, jetstream=False
        ),
        ACCOUNT_JWT_NAME: lambda: _signed_account(auth, {}),
    }
    for name, sign in claims.items():  # signed once: the include file is the same on every host
        if not (auth.dir / name).is_file() or (auth.dir / name).is_symlink():
            _write_private(auth.dir / name, sign())
    _write_private(auth.conf, server_include(auth))
    for name in TOOL_USERS:
        if not auth.creds(name).is_file() or auth.creds(name).is_symlink():
            issue_user(auth, name, name, auth.creds(name))
    for name, permissions in _system_users(auth).items():
        if not auth.creds(name).is_file() or auth.creds(name).is_symlink():
            _issue_system_account_user(auth, name, permissions)
    return auth


def server_include(auth: NatsAuth) -> str:
    system = auth.key("system")
    op_jwt = (auth.dir / OPERATOR_JWT_NAME).read_text().strip()
    sys_jwt = (auth.dir / SYSTEM_JWT_NAME).read_text().strip()
    account = auth.key("account").public_key
    return (
        "# Generated by `mohawk pki nats-auth` / `mohawk up`: NATS's decentralised auth. Users are\n"
        "# signed by the account below; their .creds are given to each process, never here.\n"
        f"operator: {json.dumps(op_jwt)}\n"
        f"system_account: {json.dumps(system.public_key)}\n"
        f"max_control_line: {MAX_CONTROL_LINE}\n"
        "resolver_preload: {\n"
        f"  {account}: {json.dumps(auth.account_jwt.read_text().strip())}\n"
        f"  {system.public_key}: {json.dumps(sys_jwt)}\n"
        "}\n"
    )


def resolver_block(jwt_dir: str | Path) -> str:
    """The server's `resolver {}`: a full resolver keeping account JWTs under `jwt_dir` (its own
    per server), which takes newer ones pushed on `$SYS.REQ.CLAIMS.UPDATE` and passes them to the
    servers it routes to."""
    return f"resolver: {{ type: full, dir: {json.dumps(str(jwt_dir))}, allow_delete: false }}\n"


def issue_user(
    auth: NatsAuth,
    name: str,
    role: str,
    path: Path,
    *,
    models: Sequence[str] = (),
    serial: int | None = None,
    expires_at: int | None = None,
) -> Path:
    """A new user for process `name` in `role`, its `.creds` written to `path` (0600) and entered
    in the ledger (with the certificate `serial` it goes with, which `mohawk pki revoke` names)."""
    user = NKey.create("user")
    permissions = process_permissions(role, name, models=models)
    token = user_jwt(
        auth.key("account"), user.public_key, name=name, permissions=permissions, expires_at=expires_at
    )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(path, creds_text(token, user))
    entry = {
        "name": name,
        "role": role,
        "public_key": user.public_key,
        "serial": serial,
        "issued_at": int(time.time()),
    }
    _write_private(auth.ledger, json.dumps([*auth.users(), entry], indent=1))
    return path


def users_of_serials(auth: NatsAuth, serials: Iterable[int]) -> list[str]:
    """The public keys of every user issued with one of `serials`' certificates."""
    wanted = set(serials)
    return [str(user["public_key"]) for user in auth.users() if user.get("serial") in wanted]


def users_named(auth: NatsAuth, names_: Iterable[str]) -> list[str]:
    wanted = set(names_)
    return [str(user["public_key"]) for user in auth.users() if user.get("name") in wanted]


def revoked_account(auth: NatsAuth, public_keys: Iterable[str], *, at: int | None = None) -> str:
    """The account re-signed with `public_keys` also revoked (their JWTs issued up to `at`, default
    now), written nowhere: `push_account` it, then `save_account`."""
    revocations = auth.revocations()
    when = int(time.time()) if at is None else at
    for key in public_keys:
        revocations[key] = max(revocations.get(key, 0), when)
    return _signed_account(auth, revocations)


def save_account(auth: NatsAuth, token: str) -> None:
    """Keep the account's JWT `token` as its newest, in `account.jwt` and the server's include (so a
    server started or restarted later preloads it)."""
    _write_private(auth.account_jwt, token)
    _write_private(auth.conf, server_include(auth))


def revoke_users(auth: NatsAuth, public_keys: Iterable[str], *, at: int | None = None) -> str:
    """`revoked_account`, saved; returned for `push_account`."""
    token = revoked_account(auth, public_keys, at=at)
    save_account(auth, token)
    return token


def _signed_account(auth: NatsAuth, revocations: dict[str, int]) -> str:
    return account_jwt(
        auth.key("operator"), auth.key("account").public_key, name=ACCOUNT_NAME, revocations=revocations
    )


def connection_events(account_public_key: str) -> tuple[str, str]:
    """The subjects nats-server announces the account's client connections and disconnections on
    (`io.nats.server.advisory.v1.client_connect` / `client_disconnect`, in the system account)."""
    return (f"$SYS.ACCOUNT.{account_public_key}.CONNECT", f"$SYS.ACCOUNT.{account_public_key}.DISCONNECT")


def _system_users(auth: NatsAuth) -> dict[str, UserPermissions]:
    """The system account's users (the operator's), each with what it may do:
    - `system` pushes account updates and asks the servers about themselves (`$SYS.REQ.>`: what
      `nats server report connections` does over NATS, where auth applies, instead of the
      unauthenticated monitoring port), and reads their answers;
    - `events` only hears the MOHAWK account's connection advisories (no publish, no other
      account's events, no server requests): the coordinators' ear on the servers."""
    return {
        SYSTEM_USER: UserPermissions(publish=(UPDATE_SUBJECT, SYSTEM_REQUESTS), subscribe=("_INBOX.>",)),
        EVENTS_USER: UserPermissions(publish=(), subscribe=connection_events(auth.key("account").public_key)),
    }


def _issue_system_account_user(auth: NatsAuth, name: str, permissions: UserPermissions) -> None:
    user = NKey.create("user")
    token = user_jwt(auth.key("system"), user.public_key, name=name, permissions=permissions, expires_at=None)
    _write_private(auth.creds(name), creds_text(token, user))


def _write_private(path: Path, text: str) -> None:
    """A new 0600 file (`private_files.write_new`), in a directory made 0700 if missing."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_new(path, text)


async def push_account(
    servers: list[str], auth: NatsAuth, token: str, *, tls_ca: Path | None = None, deadline_s: float = 4.0
) -> bool:
    """Hand the account's JWT `token` to the running servers as the system user: the one that takes
    it stores it and passes it on to the others, and each drops the connections of users it now
    revokes. False when no server takes account updates (a NATS run without users: there is
    nothing to revoke there); ConnectionError when none can be reached; PushRefused when one
    refuses the update."""
    nc = await connect_or_give_up(
        servers, name="mohawk-pki-system", deadline_s=deadline_s, creds=auth.creds(SYSTEM_USER), tls_ca=tls_ca
    )
    try:
        reply = await nc.request(UPDATE_SUBJECT, token.encode(), timeout=deadline_s)
    except NoRespondersError:
        return False
    finally:
        await nc.close()
    answer = json.loads(reply.data or b"{}")
    if "error" in answer:
        raise PushRefused(f"nats-server refused the account update: {answer['error']}")
    return True


class PushRefused(ConnectionError):
    """A server answered an account update with an error."""
