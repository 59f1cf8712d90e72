"""Admission benchmark: how fast a gateway refuses what it has no room for, under a burst of clients.

A 1-node `mohawk up` cluster with the gateway's `MOHAWK_MAX_IN_FLIGHT` set to --max-in-flight;
--clients concurrent clients each send one chat request (16 tokens, non-streaming) at once, each on
its own connection from a raw asyncio socket (httpx's own per-request cost, about 5 ms of CPU
here, would swamp the figure). Every answer's status and latency (request written to status
and headers read) is recorded; the
report gives the count of each status and p50/p99/max latency of the 429s and of the 200s. The
429s must carry Retry-After and come back fast: admission is decided before tokenizing, by the
requests in flight and being tokenized (`Admission.has_room`, `mohawk_gateway/admission.py`).
The client runs in this process on the same 2 cores as the cluster, so its own scheduling is in
the figures.
`python bench/admission.py` (default: 1,200 clients, room for 64).

`--keep-alive SECONDS` measures instead what well-behaved clients see (as the OpenAI SDK behaves:
a pooled keep-alive connection, and a retry after the Retry-After it was given): each client opens
its connection first, then for SECONDS sends its request, and after a 429 waits the Retry-After
(with up to 10% jitter) and sends it again; a client whose request was served sends another.
The report covers every 429 and 200 answered in that time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from results_file import write_results

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from mohawk_common.logging import configure_logging
from mohawk_common.processes import stop_process

T = TypeVar("T")


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


def _chat_payload(*, keep_alive: bool) -> bytes:
    """One chat request (16 tokens, non-streaming) as raw HTTP/1.1."""
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
        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


async def burst(port: int, clients: int) -> list[tuple[int, float, bool]]:
    """`clients` chat requests sent at once, each on its own new connection."""
    payload = _chat_payload(keep_alive=False)
    return list(await asyncio.gather(*(_one(port, payload) for _ in range(clients))))


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, float]:
    """Status and Retry-After (0 when absent) of one response, its body read to the end."""
    status_line = await reader.readline()
    length, retry_after = 0, 0.0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "retry-after":
            retry_after = float(value)
    await reader.readexactly(length)
    parts = status_line.split()
    return (int(parts[1]) if len(parts) > 1 else 0), retry_after


async def _polite_client(
    port: int, payload: bytes, until: float, rng: random.Random
) -> list[tuple[int, float, bool]]:
    """One keep-alive client retrying after each 429's Retry-After until `until`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    results = []
    await asyncio.sleep(rng.uniform(0, 1))  # clients do not all start in the same millisecond
    while time.perf_counter() < until:
        start = time.perf_counter()
        writer.write(payload)
        await writer.drain()
        status, retry_after = await _read_answer(reader)
        results.append((status, time.perf_counter() - start, retry_after > 0))
        if status == 429:
            await asyncio.sleep(retry_after * rng.uniform(1.0, 1.1))
        elif status != 200:
            break
    writer.close()
    return results


async def polite(port: int, clients: int, seconds: float) -> list[tuple[int, float, bool]]:
    """`clients` keep-alive clients that honour Retry-After, for `seconds`."""
    payload = _chat_payload(keep_alive=True)
    until = time.perf_counter() + seconds
    rng = random.Random(7)
    done = await asyncio.gather(
        *(_polite_client(port, payload, until, random.Random(rng.random())) for _ in range(clients))
    )
    return [result for client in done for result in client]


def run(clients: Coroutine[object, object, T]) -> T:
    """Run the clients on uvloop where installed: on these 2 shared cores every microsecond the
    clients spend is one the gateway under test does not get."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(clients)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(clients)


def _percentiles(values: list[float]) -> str:
    if not values:
        return "–"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p99 * 1000:.0f} / {ordered[-1] * 1000:.0f}"


def _report(what: str, results: list[tuple[int, float, bool]]) -> tuple[list[float], list[float]]:
    statuses = Counter(status for status, _, _ in results)
    refused = [seconds for status, seconds, _ in results if status == 429]
    served = [seconds for status, seconds, _ in results if status == 200]
    with_retry_after = sum(1 for status, _, has in results if status == 429 and has)
    print(f"{what}: statuses {dict(sorted(statuses.items()))}; 429s with Retry-After: {with_retry_after}")
    print("| answer | count | latency median / p99 / max, ms |")
    print("|---|---|---|")
    print(f"| 429 | {len(refused)} | {_percentiles(refused)} |")
    if served:
        print(f"| 200 | {len(served)} | {_percentiles(served)} |")
    return refused, served


_BARE_SERVER = """
import asyncio, sys, uvloop
BODY = b'{"error": {"code": "rate_limit_exceeded"}}'
ANSWER = (b"HTTP/1.1 429 Too Many Requests\\r\\ncontent-type: application/json\\r\\nretry-after: 1\\r\\n"
          b"content-length: %d\\r\\n\\r\\n" % len(BODY)) + BODY
class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while b"\\r\\n\\r\\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\\r\\n\\r\\n")
            lines = head.lower().split(b"\\r\\n")
            length = next((int(l[15:]) for l in lines if l.startswith(b"content-length:")), 0)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(ANSWER)
            if b"connection: close" in head.lower():
                self.transport.close()
async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Answer, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await server.serve_forever()
uvloop.run(main())
"""


@contextlib.contextmanager
def _bare_server() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _BARE_SERVER, str(port)])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield port
    finally:
        stop_process(proc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=1200)
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument(
        "--keep-alive", type=float, metavar="SECONDS", help="polite keep-alive clients for this long"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the same clients against a bare uvloop server that answers every request "
        "with a fixed 429 (no HTTP framework, no app): the floor this machine sets",
    )
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
            run(burst(spec.port, 4))  # warm-up
            if args.keep_alive:
                results = run(polite(spec.port, args.clients, args.keep_alive))
            else:
                results = run(burst(spec.port, args.clients))
    how = (
        f"keep-alive, retrying after Retry-After, for {args.keep_alive:.0f} s"
        if args.keep_alive
        else "at once"
    )
    print(f"{args.clients} concurrent clients ({how}), room for {args.max_in_flight} in flight")
    refused, served = _report("the gateway", results)
    if args.floor:
        with _bare_server() as port:
            run(burst(port, 4))
            if args.keep_alive:
                floor = run(polite(port, args.clients, args.keep_alive))
            else:
                floor = run(burst(port, args.clients))
        _report("bare uvloop server, fixed 429 (the floor)", floor)
    if args.json:
        write_results(args.json, {"refused_s": refused, "served_s": served}, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
