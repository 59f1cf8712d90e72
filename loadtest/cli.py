"""`python -m loadtest`: the 1,000-session load test, or its short form (`--short`).

Without `--url` it starts a redis-server and a 1-node local cluster with auth on (in a temporary
directory, or `--data-dir`); with `--url` and `--redis-url` it drives a running cluster, whose
tenants `gold`, `silver` and `bronze` it replaces and removes at the end. It prints the report's
tables (markdown) to stdout, writes `--json` and `--png` when given, and exits 1 when an
acceptance check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from loadtest.run import run_load, write_outputs
from loadtest.spec import LoadSpec, standard_spec
from loadtest.table import markdown, memory_table
from loadtest.target import Target, local_target
from mohawk_common.logging import configure_logging

log = structlog.get_logger("loadtest")

FILES_PER_CONNECTION = 2  # a socket, and headroom for everything else the process opens


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="the short form: 100 sessions, 10 chat clients")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 1000; 100 with --short)")
    parser.add_argument("--chat-clients", type=int, help="plain streaming chat clients (50; 10 with --short)")
    parser.add_argument(
        "--tokens", type=int, help="tokens per turn and per chat request (16; 8 with --short)"
    )
    parser.add_argument("--quota-rpm", type=int, help="bronze's requests a minute (240; 50 with --short)")
    parser.add_argument(
        "--ttft-objective-s",
        type=float,
        help="the local gateway's time-to-first-token objective (admission by predicted wait: over it, "
        "429 with Retry-After); the report's goodput counts requests within it (default: none)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--png", type=Path, help="draw the plot here")
    parser.add_argument("--url", help="drive this running gateway instead of starting a cluster")
    parser.add_argument("--redis-url", help="the Redis of the gateway at --url (its tenants live there)")
    parser.add_argument(
        "--pid",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="with --url: a process whose RSS to watch",
    )
    parser.add_argument("--data-dir", type=Path, help="where the local cluster keeps its files and logs")
    parser.add_argument("--threads", type=int, help="torch threads of the local cluster's node")
    parser.add_argument("--seed", type=int, default=0, help="seed of the retry spread")
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the whole load on the same cluster (a leak grows run after run, a working set "
        "does not); the report, plot and exit status are the first run's, the later runs' memory "
        "rows are printed",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if (args.url is None) != (args.redis_url is None):
        parser.error("--url and --redis-url go together")
    if args.pid and args.url is None:
        parser.error("--pid only with --url (a local cluster's processes are watched anyway)")
    return args


def _pids(items: Sequence[str]) -> dict[str, int]:
    pids = {}
    for item in items:
        name, _, pid = item.partition("=")
        if not name or not pid.isdigit():
            raise SystemExit(f"python -m loadtest: error: --pid wants NAME=PID, not {item!r}")
        pids[name] = int(pid)
    return pids


def raise_file_limit(spec: LoadSpec) -> None:
    """Room for a connection per client, here and in the cluster this process starts (children
    inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FILES_PER_CONNECTION * (spec.num_sessions + spec.num_chat_clients) + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
        )


@contextmanager
def target_of(args: argparse.Namespace) -> Iterator[Target]:
    if args.url is not None:
        yield Target(args.url.rstrip("/"), args.redis_url, _pids(args.pid))
        return
    with tempfile.TemporaryDirectory(prefix="mohawk-loadtest-") as scratch:
        data_dir = args.data_dir or Path(scratch)
        log.info("starting a local cluster", data_dir=str(data_dir))
        with local_target(
            data_dir, threads_per_node=args.threads, ttft_objective_s=args.ttft_objective_s
        ) as target:
            log.info("cluster ready", url=target.url)
            yield target


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: the cluster and redis-server this run started stop


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    configure_logging("info", json=False)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    spec = standard_spec(
        short=args.short,
        num_sessions=args.sessions,
        num_chat_clients=args.chat_clients,
        tokens_per_turn=args.tokens,
        quota_rpm=args.quota_rpm,
        ttft_objective_s=args.ttft_objective_s,
    )
    raise_file_limit(spec)
    report: dict[str, Any]
    with target_of(args) as target:
        report = asyncio.run(run_load(spec, target, seed=args.seed))
        later = [asyncio.run(run_load(spec, target, seed=args.seed + n)) for n in range(1, args.runs)]
    printed = markdown(report) + "".join(
        f"\nRun {n} on the same cluster, memory only:\n\n{memory_table(again)}"
        for n, again in enumerate(later, start=2)
    )
    write_outputs(report, args.json, args.png, printed, argv)
    sys.stdout.write(printed)
    return 0 if report["passed"] else 1
