"""`mohawk tenant add|ls|show|update|rotate-key|rm`: the tenants and API keys every gateway checks.

They live in Redis (`mohawk_common.tenancy`), at `--redis-url`, else MOHAWK_REDIS_URL, else
redis://127.0.0.1:6379/0 (where `mohawk up` starts its redis-server when that port is free), with
the password in `--redis-password-file`, else MOHAWK_REDIS_PASSWORD_FILE, else `mohawk up`'s
(.mohawk/redis/password) where there is one. A new
key is printed once, alone on stdout (so `KEY=$(mohawk tenant add acme)` works), and never again:
Redis keeps only its SHA-256. An unknown tenant or a bad limit ends as one line on stderr and exit
status 2, an unreachable Redis as one line and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from mohawk_common.tenancy import Tenant, TenantStore

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PASSWORD_FILE = ".mohawk/redis/password"  # `mohawk up`'s, in its default data dir
_PRIORITIES = ("high", "normal", "low")
_KEEP_IT = "save it now: it cannot be shown again (mohawk tenant rotate-key makes a new one)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(
        dest="tenant_command", required=True, metavar="{add,ls,show,update,rotate-key,rm}"
    )
    add = commands.add_parser("add", help="add a tenant and print its new API key (once)")
    update = commands.add_parser("update", help="change a tenant's limits (its key stays)")
    ls = commands.add_parser("ls", help="list the tenants and their limits")
    show = commands.add_parser("show", help="one tenant's limits")
    rotate = commands.add_parser("rotate-key", help="print a new API key; the old one stops working")
    rm = commands.add_parser("rm", help="remove a tenant; its key stops working")
    for command in (add, update, show, rotate, rm):
        command.add_argument("name", help="the tenant's name: a-z, 0-9, _ and -, 64 characters at most")
    for command, default in ((add, None), (update, argparse.SUPPRESS)):
        what = "(default: unlimited)" if default is None else "(none: unlimited)"
        command.add_argument("--rpm", type=_limit, default=default, help=f"requests a minute {what}")
        command.add_argument("--tpm", type=_limit, default=default, help=f"tokens a minute {what}")
        command.add_argument(
            "--max-concurrency", type=_limit, default=default, help=f"requests running at once {what}"
        )
        command.add_argument(
            "--priority",
            choices=_PRIORITIES,
            default="normal" if default is None else default,
            help="scheduling priority (default normal)",
        )
        command.add_argument(
            "--weight",
            type=float,
            default=1.0 if default is None else default,
            help="share of the pipeline against other tenants (default 1)",
        )
        command.add_argument(
            "--ttft-objective-s",
            type=_seconds,
            default=default,
            help="refuse (429, Retry-After) requests whose first token is predicted later than this "
            "(default: none, the gateway's MOHAWK_TTFT_OBJECTIVE_S)",
        )
    for command in (add, update, ls, show, rotate, rm):
        command.add_argument(
            "--redis-url",
            help=f"the Redis of the tenants (default: MOHAWK_REDIS_URL, or {DEFAULT_REDIS_URL})",
        )
        command.add_argument(
            "--redis-password-file",
            type=Path,
            help="a file holding its password (default: MOHAWK_REDIS_PASSWORD_FILE, or "
            f"{DEFAULT_PASSWORD_FILE} where `mohawk up` keeps it, if there)",
        )


def run(args: argparse.Namespace) -> int:
    """Run one `mohawk tenant` subcommand; 2 on an operator error, 1 when Redis cannot be reached."""
    from mohawk_common.errors import ConfigError
    from mohawk_common.tenancy import TenancyError, TenancyUnavailable, TenantStore, connect, read_password

    url = args.redis_url or os.environ.get("MOHAWK_REDIS_URL") or DEFAULT_REDIS_URL
    password_file = args.redis_password_file or os.environ.get("MOHAWK_REDIS_PASSWORD_FILE")
    if password_file is None and Path(DEFAULT_PASSWORD_FILE).is_file():
        password_file = DEFAULT_PASSWORD_FILE
    handlers: dict[str, Callable[[TenantStore, argparse.Namespace], Awaitable[None]]] = {
        "add": _add,
        "update": _update,
        "ls": _ls,
        "show": _show,
        "rotate-key": _rotate,
        "rm": _rm,
    }

    async def main() -> None:
        tls_ca = os.environ.get("MOHAWK_REDIS_TLS_CA")  # a rediss:// Redis: its CA (the gateway's)
        client = connect(
            url,
            password=read_password(Path(password_file)) if password_file else None,
            tls_ca=Path(tls_ca) if tls_ca else None,
        )
        try:
            await handlers[args.tenant_command](TenantStore(client), args)
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    except TenancyUnavailable as exc:
        cause = exc.__cause__ or exc
        if _refused_for_a_password(cause):
            print(
                f"mohawk tenant: error: Redis at {_redacted(url)} refused us ({cause}): give its password "
                "with --redis-password-file or MOHAWK_REDIS_PASSWORD_FILE (`mohawk up` keeps it in "
                "<data-dir>/redis/password)",
                file=sys.stderr,
            )
            return 1
        print(
            f"mohawk tenant: error: cannot reach Redis at {_redacted(url)} ({cause}); start one "
            "(`mohawk up` does) or point --redis-url / MOHAWK_REDIS_URL at it",
            file=sys.stderr,
        )
        return 1
    except (TenancyError, ConfigError) as exc:
        print(f"mohawk tenant: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a malformed URL
        print(f"mohawk tenant: error: --redis-url {_redacted(url)}: {exc}", file=sys.stderr)
        return 2
    return 0


def _refused_for_a_password(cause: BaseException) -> bool:
    """Whether Redis refused for want of (the right) password: redis-py says so in several ways."""
    text = str(cause).lower()
    return any(word in text for word in ("authenticat", "noauth", "wrongpass", "invalid password"))


async def _add(store: TenantStore, args: argparse.Namespace) -> None:
    tenant, api_key = await store.add(args.name, **_limits(args))
    print(api_key, flush=True)
    print(f"mohawk tenant: added '{tenant.name}' ({_summary(tenant)}); {_KEEP_IT}", file=sys.stderr)


async def _update(store: TenantStore, args: argparse.Namespace) -> None:
    tenant = await store.update(args.name, **_limits(args))
    print(f"mohawk tenant: '{tenant.name}' now has {_summary(tenant)}", file=sys.stderr)


async def _ls(store: TenantStore, args: argparse.Namespace) -> None:
    tenants = await store.list()
    if not tenants:
        print("no tenants (mohawk tenant add NAME)", file=sys.stderr)
        return
    rows = [("NAME", "LABEL", "PRIORITY", "WEIGHT", "RPM", "TPM", "CONCURRENCY", "KEY")]
    for t in tenants:
        rows.append(
            (
                t.name,
                t.label,
                t.priority,
                f"{t.weight:g}",
                _text(t.rpm),
                _text(t.tpm),
                _text(t.max_concurrency),
                f"{t.key_prefix}...",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


async def _show(store: TenantStore, args: argparse.Namespace) -> None:
    from mohawk_common.tenancy import TenantNotFound

    tenant = await store.get(args.name)
    if tenant is None:
        raise TenantNotFound(f"no tenant '{args.name}'")
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(tenant.created))
    for label, value in (
        ("name", tenant.name),
        ("label", f"{tenant.label} (its name in telemetry)"),
        ("priority", tenant.priority),
        ("weight", f"{tenant.weight:g}"),
        ("rpm", _text(tenant.rpm)),
        ("tpm", _text(tenant.tpm)),
        ("max concurrency", _text(tenant.max_concurrency)),
        ("ttft objective", _objective(tenant.ttft_objective_s)),
        ("key", f"{tenant.key_prefix}..."),
        ("created", created),
    ):
        print(f"{label + ':':<17}{value}")


async def _rotate(store: TenantStore, args: argparse.Namespace) -> None:
    api_key = await store.rotate_key(args.name)
    print(api_key, flush=True)
    print(
        f"mohawk tenant: new key for '{args.name}'; the old one no longer works; {_KEEP_IT}", file=sys.stderr
    )


async def _rm(store: TenantStore, args: argparse.Namespace) -> None:
    await store.remove(args.name)
    print(f"mohawk tenant: removed '{args.name}'; its key no longer works", file=sys.stderr)


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limit flags given (all of them for add; only those on the command line for update)."""
    from mohawk_common.tenancy.tenants import LIMIT_FIELDS

    return {field: getattr(args, field) for field in LIMIT_FIELDS if hasattr(args, field)}


def _seconds(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 (or none)")
    return value


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "unlimited"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number or none, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"want at least 1 (or none for unlimited), got {value}")
    return value


def _objective(seconds: float | None) -> str:
    return "the gateway's" if seconds is None else f"{seconds:g} s"


def _text(limit: int | None) -> str:
    return "-" if limit is None else str(limit)


def _summary(tenant: Tenant) -> str:
    limits = ", ".join(
        f"{label} {_text(value)}"
        for label, value in (
            ("rpm", tenant.rpm),
            ("tpm", tenant.tpm),
            ("max concurrency", tenant.max_concurrency),
        )
    )
    return f"{limits}, priority {tenant.priority}, weight {tenant.weight:g}"


def _redacted(url: str) -> str:
    """The URL without its password, fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
