"""`mohawk pki init|issue|revoke|rotate-seal|show|nats-auth|nats-tls|compose-bundles`: the command
line of the operator's PKI on disk, its revocation list and sealing keys on the bus, and the bus's
own users.

Everything lives under one directory (default `.mohawk/pki`, laid out as `mohawk_pqc.pki_files`
describes): the root, the newest signed revocation list, and one bundle per node under `nodes/`,
which is what that node's service loads, with the node's own NATS user in it (`nats.creds`,
`mohawk_cli.bus_identity`; the NATS operator's keys under `nats-auth/`); `show` lists it
(`mohawk_cli.pki_listing`). `revoke` also revokes the users issued with the revoked certificates
(the account's revocations); with `--nats-url` it pushes that to the servers, which drop those
users' connections at once, puts the new list into the PKI bucket, where running services pick it
up (as NATS's admin user, `--creds`, where NATS has users), and rotates the request-sealing key of
every model a revoked shard held (`rotate-seal` does that alone): the new key goes to the model's
other shard nodes in a root-signed record on the same bucket (`mohawk_cli.pki_publish`).
`nats-auth DIR` makes a NATS operator and account (`mohawk_common.bus.nats_auth`): the server's
include file and the tools' users, kept on later runs, and with `--user ID:ROLE` a process's user.
`compose-bundles DIR --model M` issues what one Compose host needs (`mohawk_cli.compose_bundles`):
a bundle and its own NATS user per service and the server's accounts, nothing of the root's
private key. This module parses the flags and prints; operator
mistakes (no root yet, a missing or foreign file, a bad flag) end as one line on stderr and exit
status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from mohawk_cli.bus_identity import NATS_AUTH_DIR, issue_with_identity
from mohawk_cli.compose_bundles import SERVICES, write_compose_bundles
from mohawk_cli.pki_listing import fingerprint, issued_serials, listing
from mohawk_cli.pki_publish import revoke_and_publish, rotate_and_publish
from mohawk_cli.seal_schedule import DEFAULT_SEAL_ROTATION_DAYS
from mohawk_common.bus import names
from mohawk_common.bus.config import BusSettings
from mohawk_common.bus.nats_auth import (
    TOOL_USERS,
    NatsAuth,
    init_auth,
    issue_user,
    push_account,
    revoked_account,
    save_account,
    users_of_serials,
)
from mohawk_common.bus.nats_permissions import ROLES
from mohawk_common.bus.nats_tls import CONTAINER_DIR, LOCAL_HOSTS, init_ca, issue_server, write_servers
from mohawk_common.errors import MohawkError
from mohawk_common.logging import configure_logging
from mohawk_common.settings import load_settings
from mohawk_pqc.errors import PkiError
from mohawk_pqc.pki_files import (
    describe,
    init_pki,
    load_root_key,
    read_message,
    revoke,
    seal_models,
    seal_models_due,
)
from mohawk_proto.v1 import security_pb2

DEFAULT_PKI_DIR = ".mohawk/pki"
NODE_ROLES = ("shard", "gateway", "coordinator")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(
        dest="pki_command",
        required=True,
        metavar="{init,issue,revoke,rotate-seal,show,nats-auth,nats-tls,compose-bundles}",
    )
    init_cmd = commands.add_parser("init", help="create the operator root and an empty revocation list")
    init_cmd.add_argument(
        "--force", action="store_true", help="replace an existing root (every certificate dies)"
    )
    issue_cmd = commands.add_parser(
        "issue", help="certify a node and write its bundle to <pki-dir>/nodes/<id>/"
    )
    issue_cmd.add_argument(
        "--node-id", required=True, type=_node_id, help="the node's id, as its service uses it"
    )
    issue_cmd.add_argument("--role", required=True, choices=NODE_ROLES)
    issue_cmd.add_argument(
        "--model",
        action="append",
        default=[],
        help="a served model: shard bundles get its request-sealing key, others its certificate (repeatable)",
    )
    issue_cmd.add_argument("--days", type=_days, default=365.0, help="validity in days (default 365)")
    revoke_cmd = commands.add_parser("revoke", help="sign a newer revocation list that adds serials")
    revoke_cmd.add_argument("--serial", type=_serial, action="append", required=True, help="repeatable")
    revoke_cmd.add_argument("--nats-url", help="also publish the list on this NATS (URLs comma-separated)")
    revoke_cmd.add_argument(
        "--creds", type=Path, help="NATS credential of the admin role (default: MOHAWK_NATS_CREDS)"
    )
    revoke_cmd.add_argument(
        "--nats-auth",
        type=Path,
        help="the NATS operator's directory whose users to revoke (default: <pki-dir>/nats-auth)",
    )
    rotate_cmd = commands.add_parser(
        "rotate-seal", help="a new request-sealing key for models, published to their valid shard nodes"
    )
    rotate_cmd.add_argument(
        "--model", action="append", default=[], help="a model to rotate (repeatable; default: every model)"
    )
    rotate_cmd.add_argument(
        "--due",
        action="store_true",
        help="only the models whose key is --every days old or more (for cron or a timer)",
    )
    rotate_cmd.add_argument(
        "--every",
        type=_days,
        default=DEFAULT_SEAL_ROTATION_DAYS,
        help="with --due: the rotation period in days (default %(default)g)",
    )
    rotate_cmd.add_argument("--nats-url", help="NATS to publish on (default: MOHAWK_NATS_URL)")
    rotate_cmd.add_argument(
        "--creds", type=Path, help="NATS credential of the admin role (default: MOHAWK_NATS_CREDS)"
    )
    show_cmd = commands.add_parser("show", help="the root, every issued bundle and the revocation list")
    nats_auth_cmd = commands.add_parser(
        "nats-auth",
        help="a NATS operator and account: DIR/nats-auth.conf for nats-server, DIR/creds/{ops,admin}"
        ".creds for the tools (kept if there); --user: a process's own user",
    )
    nats_auth_cmd.add_argument("dir", type=Path, help="where to write them, e.g. config/nats/auth")
    nats_auth_cmd.add_argument(
        "--user",
        action="append",
        default=[],
        type=_user_spec,
        metavar="ID:ROLE[:MODEL]",
        help="also a user for process ID in ROLE (shard: serving MODEL, else any), in "
        "DIR/creds/ID.creds, kept if there (repeatable); a node's certificate bundle gets its own "
        "from `mohawk pki issue`",
    )
    nats_auth_cmd.add_argument(
        "--tls",
        metavar="NAME[,HOST...]",
        help="also TLS for one nats-server reached at these names, in DIR (its nats-tls.conf), from "
        "a bus CA under DIR/nats-tls (development: docker-compose.dev.yml)",
    )
    nats_auth_cmd.add_argument("--seen-at", help="with --tls: where the server finds DIR (default: DIR)")
    nats_tls_cmd = commands.add_parser(
        "nats-tls",
        help="TLS for nats-servers from the bus CA (<pki-dir>/nats-tls, made if absent): DIR/<server>/ "
        "with its certificate, key, the CA's certificate and tls {} includes for clients and routes",
    )
    nats_tls_cmd.add_argument("dir", type=Path, help="where to write them, e.g. config/nats/tls")
    nats_tls_cmd.add_argument(
        "--server",
        action="append",
        required=True,
        help="NAME[,HOST...]: a server and the other names or addresses it is reached at (repeatable)",
    )
    nats_tls_cmd.add_argument(
        "--seen-at",
        default=CONTAINER_DIR,
        help="where each server finds its directory (default: %(default)s)",
    )
    bundles_cmd = commands.add_parser(
        "compose-bundles",
        help="for docker-compose.yml: DIR/<service>/ with its own bundle and NATS credential, "
        "DIR/nats/ with the server's users",
    )
    bundles_cmd.add_argument("dir", type=Path, help="where to write them, e.g. ./mohawk-bundles")
    bundles_cmd.add_argument("--model", required=True, help="the served model the host's certificates name")
    bundles_cmd.add_argument(
        "--host",
        type=_node_id,
        default="host1",
        help="this host's MOHAWK_HOST_ID: node ids are <host>-<service> (default: %(default)s)",
    )
    bundles_cmd.add_argument("--days", type=_days, default=365.0, help="validity in days (default 365)")
    for command in (init_cmd, issue_cmd, revoke_cmd, rotate_cmd, show_cmd, bundles_cmd, nats_tls_cmd):
        command.add_argument(
            "--pki-dir", type=Path, default=Path(DEFAULT_PKI_DIR), help="default: %(default)s"
        )


def run(args: argparse.Namespace) -> int:
    """Run one `mohawk pki` subcommand; 2 on an operator error, 1 when NATS cannot be reached."""
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "init": _init,
        "issue": _issue,
        "revoke": _revoke,
        "rotate-seal": _rotate_seal,
        "show": _show,
        "nats-auth": _nats_auth,
        "nats-tls": _nats_tls,
        "compose-bundles": _compose_bundles,
    }
    try:
        return handlers[args.pki_command](args)
    except ConnectionError as exc:  # only revoke --nats-url reaches the network
        done = "revoked" if args.pki_command == "revoke" else "rotated"
        print(f"mohawk pki: error: {exc}; nothing was {done}", file=sys.stderr)
        return 1
    except (MohawkError, OSError) as exc:
        print(f"mohawk pki: error: {exc}", file=sys.stderr)
        return 2


def _nats_auth(args: argparse.Namespace) -> int:
    auth = init_auth(args.dir)
    if args.tls:
        hosts = (*args.tls.split(","), *LOCAL_HOSTS)
        print(issue_server(init_ca(args.dir), args.dir, hosts, seen_at=args.seen_at).client_conf)
    print(auth.conf)
    for name in TOOL_USERS:
        print(auth.creds(name))
    for name, role, models in args.user:
        if not auth.creds(name).is_file():
            issue_user(auth, name, role, auth.creds(name), models=models)
        print(auth.creds(name))
    print(
        f"mohawk pki: NATS operator and account in {args.dir}; include {auth.conf.name} in the server "
        "config (with a full resolver), give each process its own user's creds file "
        "(MOHAWK_NATS_CREDS); keep keys/ with the PKI and never commit any of it",
        file=sys.stderr,
    )
    return 0


def _nats_tls(args: argparse.Namespace) -> int:
    servers = {name: hosts for name, *hosts in (s.split(",") for s in args.server)}
    for server in write_servers(args.pki_dir, args.dir, servers, seen_at=args.seen_at).values():
        print(server.dir)
    return 0


def _compose_bundles(args: argparse.Namespace) -> int:
    written = write_compose_bundles(args.pki_dir, args.dir, host=args.host, model=args.model, days=args.days)
    for path in written.values():
        print(path)
    print(
        f"mohawk pki: bundles for host {args.host!r} in {args.dir}; set MOHAWK_HOST_ID={args.host} "
        f"(and MOHAWK_BUNDLES_DIR={args.dir} unless it is ./mohawk-bundles) in .env; the files are "
        "0600, so give the services' directories to the image's user (uid 10001): sudo chown -R "
        f"10001 {' '.join(str(args.dir / s.name) for s in SERVICES)}; and Redis's to the redis "
        f"image's (uid 999): sudo chown -R 999 {args.dir / 'redis'}",
        file=sys.stderr,
    )
    return 0


def _init(args: argparse.Namespace) -> int:
    root = init_pki(args.pki_dir, force=args.force)
    print(fingerprint(root.issuer))
    print(f"mohawk pki: new root in {args.pki_dir}; keep root.key offline", file=sys.stderr)
    return 0


def _issue(args: argparse.Namespace) -> int:
    bundle = issue_with_identity(
        args.pki_dir, args.node_id, args.role, models=tuple(args.model), days=args.days
    )
    print(bundle)
    print(describe(read_message(bundle / "node.cert", security_pb2.Certificate)))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    load_root_key(args.pki_dir)  # no root: say so before anything about serials
    unknown = sorted(set(args.serial) - issued_serials(args.pki_dir))
    if unknown:
        raise PkiError(f"{args.pki_dir} never issued serial(s) {', '.join(map(str, unknown))}")
    revoked = _bus_users_revoked(args)
    if args.nats_url is None:
        if revoked is not None:
            save_account(*revoked)
            print("mohawk pki: the NATS users revoked (a server started now refuses them)", file=sys.stderr)
        crl = revoke(args.pki_dir, args.serial)
    else:
        settings = _bus_settings(args)

        async def revoke_users_on_the_bus() -> None:  # first: their connections dropped at once
            if revoked is None:
                return
            pushed = await push_account(settings.nats_servers, *revoked, tls_ca=settings.nats_tls_ca)
            save_account(*revoked)
            print(
                "mohawk pki: the NATS users revoked on the servers"
                if pushed
                else "mohawk pki: that NATS has no users (no accounts to revoke them in)",
                file=sys.stderr,
            )

        crl = asyncio.run(
            revoke_and_publish(
                args.pki_dir,
                args.serial,
                settings.nats_servers,
                settings.bus_limits(),
                creds=settings.nats_creds,
                first=revoke_users_on_the_bus,
            )
        )
        print(f"mohawk pki: published to {names.PKI_BUCKET}/{names.CRL_KEY}", file=sys.stderr)
    print(security_pb2.RevocationListBody.FromString(crl.body).number)
    return 0


def _bus_users_revoked(args: argparse.Namespace) -> tuple[NatsAuth, str] | None:
    """The NATS operator's directory and its account re-signed with the users issued with
    `args.serial` revoked (saved by the caller); None where there is no operator (a bus with no
    users)."""
    directory = args.nats_auth or args.pki_dir / NATS_AUTH_DIR
    if not (directory / "keys").is_dir():
        if args.nats_auth is not None:
            raise PkiError(f"{directory} has no NATS operator (mohawk pki nats-auth makes one)")
        return None
    auth = NatsAuth(directory)
    return auth, revoked_account(auth, users_of_serials(auth, args.serial))


def _rotate_seal(args: argparse.Namespace) -> int:
    load_root_key(args.pki_dir)
    known = seal_models(args.pki_dir)
    unknown = sorted(set(args.model) - set(known))
    if unknown:
        raise PkiError(f"{args.pki_dir} has no sealing key of model(s) {', '.join(unknown)}")
    models = args.model or known
    if args.due:
        due = set(seal_models_due(args.pki_dir, args.every))
        models = [model for model in models if model in due]
        if not models:
            print(f"mohawk pki: no sealing key is {args.every:g} days old yet", file=sys.stderr)
            return 0
    settings = _bus_settings(args)
    records = asyncio.run(
        rotate_and_publish(
            args.pki_dir,
            models,
            settings.nats_servers,
            settings.bus_limits(),
            creds=settings.nats_creds,
        )
    )
    for record in records:
        body = security_pb2.SealKeyRecordBody.FromString(record.body)
        print(f"{body.model} {body.number} copies={len(body.copies)}")
    return 0


def _bus_settings(args: argparse.Namespace) -> BusSettings:
    overrides = {"nats_url": args.nats_url, "nats_creds": args.creds}
    settings = load_settings(BusSettings, {k: v for k, v in overrides.items() if v is not None})
    configure_logging("error")  # connect's per-attempt warnings; the outcome is reported below
    return settings


def _show(args: argparse.Namespace) -> int:
    for line in listing(args.pki_dir):
        print(line)
    return 0


def _node_id(text: str) -> str:
    try:
        return names.check_id("node id", text)  # it names a directory and subjects: one safe token
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = 0.0
    if not days > 0:
        raise argparse.ArgumentTypeError(f"--days wants a positive number, got {text!r}")
    return days


def _user_spec(text: str) -> tuple[str, str, tuple[str, ...]]:
    name, _, rest = text.partition(":")
    role, _, model = rest.partition(":")
    if role not in ROLES:
        raise argparse.ArgumentTypeError(f"--user wants ID:ROLE[:MODEL], ROLE one of {', '.join(ROLES)}")
    return _node_id(name), role, (model,) if model else ()


def _serial(text: str) -> int:
    try:
        serial = int(text)
    except ValueError:
        serial = 0
    if serial <= 0:
        raise argparse.ArgumentTypeError(f"--serial wants a positive integer, got {text!r}")
    return serial
