"""Admission benchmark: how fast a gateway refuses what it has no room for, under a burst of clients.

A 1-node `mohawk up` cluster with the gateway's `MOHAWK_MAX_IN_FLIGHT` set to --max-in-flight;
--clients concurrent clients each send one chat request (16 tokens, non-streaming) at once, each on
its own connection from a raw asyncio socket (httpx's own per-request cost, about 5 ms of CPU
here, would swamp the figure). Every answer's status and latency (request written to status
and headers read) is recorded; the
report gives the count of each status and p50/p99/max latency of the 429s and of the 200s. The
429s must carry Retry-After and come back fast: admission is decided before tokenizing, by the
requests in flight and being tokenized (`Gateway.check_room`). The client runs in this process
on the same 2 cores as the cluster, so its own scheduling is in the figures.
`python bench/admission.py` (default: 1,200 clients, room for 64).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from mohawk_common.logging import configure_logging


async def _one(port: int, payload: bytes) -> tuple[int, float, bool]:
    """One request on its own connection: latency from its bytes written to its status and headers
    read (a raw socket, so the client's own cost stays out of the figure as far as it can)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, 0.0, False
    start = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    status_line = await reader.readline()
    headers = b""
    while (line := await reader.readline()) not in (b"\r\n", b""):
        headers += line.lower()
    took = time.perf_counter() - start
    writer.close()
    parts = status_line.split()
    return (int(parts[1]) if len(parts) > 1 else 0), took, b"retry-after:" in headers


async def burst(port: int, clients: int) -> list[tuple[int, float, bool]]:
    """`clients` chat requests (16 tokens, non-streaming) sent at once."""
    body = json.dumps(
        {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Tell me a fact about the moon."}],
            "max_tokens": 16,
            "temperature": 0,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    payload = head.encode() + body
    return list(await asyncio.gather(*(_one(port, payload) for _ in range(clients))))


def _percentiles(values: list[float]) -> str:
    if not values:
        return "–"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p99 * 1000:.0f} / {ordered[-1] * 1000:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=1200)
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("warning")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket a client, here and in the gateway
    wanted = min(hard, max(soft, 2 * args.clients + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    with tempfile.TemporaryDirectory(prefix="mohawk-admission-") as data_dir:
        spec = ClusterSpec(
            nodes=1,
            port=free_port(),
            nats_port=free_port(),
            data_dir=Path(data_dir),
            log_level="warning",
            env={"MOHAWK_MAX_IN_FLIGHT": str(args.max_in_flight)},
        )
        with LocalCluster(spec) as cluster:
            cluster.wait_ready(timeout=300)
            asyncio.run(burst(spec.port, 4))  # warm-up
            results = asyncio.run(burst(spec.port, args.clients))
    statuses = Counter(status for status, _, _ in results)
    refused = [seconds for status, seconds, _ in results if status == 429]
    served = [seconds for status, seconds, _ in results if status == 200]
    with_retry_after = sum(1 for status, _, has in results if status == 429 and has)
    print(f"{args.clients} concurrent clients, room for {args.max_in_flight} in flight")
    print(f"statuses: {dict(sorted(statuses.items()))}; 429s with Retry-After: {with_retry_after}")
    print("| answer | count | latency median / p99 / max, ms |")
    print("|---|---|---|")
    print(f"| 429 | {len(refused)} | {_percentiles(refused)} |")
    print(f"| 200 | {len(served)} | {_percentiles(served)} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        figures = {"statuses": statuses, "refused_s": refused, "served_s": served}
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
