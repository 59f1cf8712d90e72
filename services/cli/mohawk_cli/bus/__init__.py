"""`mohawk bus`: the ops inspector for machines without the `nats` CLI.

It mirrors the `nats` commands operators know, read-only, over the same NATS connection every
service uses (`--nats-url`, or `-s`/`--server` as `nats` takes it, else MOHAWK_NATS_URL, else
nats://127.0.0.1:4222), as the ops user where NATS needs one (`--creds FILE`, else
MOHAWK_NATS_CREDS); both go before or after the subcommand:

    mohawk bus streams [NAME]          nats stream ls / nats stream info NAME
    mohawk bus consumers STREAM        nats consumer ls STREAM (with pending and ack counts)
    mohawk bus kv ls [BUCKET]          nats kv ls / nats kv ls BUCKET
    mohawk bus kv get BUCKET KEY       nats kv get BUCKET KEY
    mohawk bus sub SUBJECT             nats sub SUBJECT (sizes, headers, who sent it; no payloads)
    mohawk bus server                  nats server info / report connections / report jetstream
                                       (from the monitoring port, --monitor-url)

Payloads between stages stay encrypted, and `sub` says so: it shows what travels in the clear
(frame headers, the sealed request's sender certificate, heartbeats) and never tries to open
anything. An unreachable server ends as one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from mohawk_common.bus.config import DEFAULT_NATS_URL

DEFAULT_MONITOR_URL = "http://127.0.0.1:8222"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_connection_flags(parser, default=None)
    commands = parser.add_subparsers(
        dest="bus_command", required=True, metavar="{streams,consumers,kv,sub,server}"
    )
    streams = commands.add_parser(
        "streams", help="the JetStream streams (= nats stream ls); NAME: one in full"
    )
    streams.add_argument("name", nargs="?", help="a stream to show in full (= nats stream info NAME)")
    consumers = commands.add_parser("consumers", help="a stream's consumers (= nats consumer ls STREAM)")
    consumers.add_argument("stream")
    kv = commands.add_parser("kv", help="key-value buckets: ls [BUCKET], get BUCKET KEY")
    kv_commands = kv.add_subparsers(dest="kv_command", required=True, metavar="{ls,get}")
    kv_ls = kv_commands.add_parser("ls", help="the buckets, or one bucket's keys")
    kv_ls.add_argument("bucket", nargs="?")
    kv_get = kv_commands.add_parser("get", help="one key's value and revision")
    kv_get.add_argument("bucket")
    kv_get.add_argument("key")
    sub = commands.add_parser("sub", help="watch a subject live (= nats sub SUBJECT): sizes, headers, sender")
    sub.add_argument("subject", help="a subject or wildcard, e.g. 'mohawk.v1.>'")
    sub.add_argument("--count", type=int, default=0, help="stop after this many messages (default: never)")
    sub.add_argument(
        "--timeout", type=float, default=0.0, help="stop after this many seconds (default: never)"
    )
    for command in (streams, consumers, kv_ls, kv_get, sub):
        _add_connection_flags(command, default=argparse.SUPPRESS)  # also after the subcommand
    server = commands.add_parser(
        "server", help="the server's monitoring endpoints: connections, JetStream use"
    )
    server.add_argument(
        "--monitor-url",
        default=os.environ.get("MOHAWK_NATS_MONITOR_URL", DEFAULT_MONITOR_URL),
        help="nats-server's HTTP monitoring address "
        f"(default: MOHAWK_NATS_MONITOR_URL or {DEFAULT_MONITOR_URL})",
    )


def _add_connection_flags(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "-s",
        "--nats-url",
        "--server",
        dest="nats_url",
        default=default,
        help=f"NATS server URL(s) (default: MOHAWK_NATS_URL or {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--creds",
        type=Path,
        default=default,
        help="NATS credential of the ops role, e.g. .mohawk/nats-auth/creds/ops.creds "
        "(default: MOHAWK_NATS_CREDS; none: connect anonymously)",
    )


def run(args: argparse.Namespace) -> int:
    nats_url = args.nats_url or os.environ.get("MOHAWK_NATS_URL") or DEFAULT_NATS_URL
    creds: Path | None = getattr(args, "creds", None)
    try:
        if args.bus_command == "server":
            from mohawk_cli.bus.monitor import show_server

            print(show_server(args.monitor_url))
            return 0
        if args.bus_command == "sub":
            from mohawk_cli.bus.live import watch

            return _run(watch(nats_url, args.subject, count=args.count, timeout_s=args.timeout, creds=creds))
        from mohawk_cli.bus import jetstream

        if args.bus_command == "streams":
            return _run(jetstream.streams(nats_url, args.name, creds=creds))
        if args.bus_command == "consumers":
            return _run(jetstream.consumers(nats_url, args.stream, creds=creds))
        if args.kv_command == "ls":
            return _run(jetstream.kv_ls(nats_url, args.bucket, creds=creds))
        return _run(jetstream.kv_get(nats_url, args.bucket, args.key, creds=creds))
    except BusInspectError as exc:
        print(f"mohawk bus: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130


class BusInspectError(Exception):
    """One line for stderr, and the exit status (1: unreachable, 2: no such thing)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _run(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def format_table(headers: list[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell, like `nats stream ls` without the box."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
