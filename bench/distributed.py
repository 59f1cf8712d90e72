"""Distributed benchmark: single-process engine vs `mohawk up --nodes 1, 2, 3`, one run, same prompts.

For each setup: batch-1 time to first token and decode tokens/s, aggregate output tokens/s of 32
concurrent streaming requests, and the inter-token gaps of the batch-1 stream. The clusters are
measured end to end through the gateway's streaming `/v1/chat/completions` (HTTP, JetStream,
activation frames, token events); the single-process engine runs in this process with no HTTP.
Per-hop latency is measured where it happens: every activation frame and step result carries its
publish time, and the receiving node reports the median and p99 of its last 1,000 hops (publish
to arrival, not counting time queued behind its own steps) in its heartbeat; the table gives the
median over nodes of their medians and the worst p99, after the batch-1 runs (an idle pipeline)
and after the 32-stream runs (a busy one).
Every figure is the median of --repeats runs with its min–max. `python bench/distributed.py` runs
the short form (CI, `make test`); `--full` the full form (`make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import TOPICS, Stat
from results_file import write_results

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import decode_json, read_plan
from mohawk_common.bus.server import free_port
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_proto.v1 import bus_pb2
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine

MODEL = "smollm2-135m-instruct"


F = TypeVar("F")  # a benchmark's Form


@dataclass(frozen=True)
class Form:
    repeats: int
    batch1_tokens: int
    concurrent_tokens: int
    node_counts: tuple[int, ...]
    num_concurrent: int = 32
    prefix_cache: bool = True  # False: every run recomputes its prompts, as transformers does
    with_transformers: bool = True  # the peer's batched generate (the full form's ratio column)


SHORT = Form(repeats=1, batch1_tokens=16, concurrent_tokens=12, node_counts=(3,), with_transformers=False)
FULL = Form(repeats=3, batch1_tokens=64, concurrent_tokens=48, node_counts=(1, 2, 3))


def questions(count: int) -> list[str]:
    """`count` questions of mixed lengths (the same shapes as bench/engine.py's prompts)."""
    return [
        f"Tell me about {TOPICS[i % len(TOPICS)]}." + " Explain every step and give examples." * (i % 8) ** 2
        for i in range(count)
    ]


@dataclass
class Batch1:
    ttft_s: float
    decode_tps: float
    gaps_s: list[float]


class EngineSetup:
    name = "single process"

    def __init__(self, prefix_cache: bool = True) -> None:
        settings = EngineSettings(num_threads=os.cpu_count(), enable_prefix_caching=prefix_cache)
        self.engine = build_local_engine(settings)
        self.tokenizer = self.engine.tokenizer

    def _ids(self, question: str) -> list[int]:
        return encode_chat(self.tokenizer, [{"role": "user", "content": question}])

    def batch1(self, question: str, num_tokens: int) -> Batch1:
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        start = time.perf_counter()
        self.engine.add_request(f"b1-{start}", self._ids(question), params)
        stamps = [time.perf_counter() for _ in self.engine.run()]
        return _batch1(start, stamps)

    def concurrent(self, qs: Sequence[str], num_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        start = time.perf_counter()
        self.engine.generate([self._ids(q) for q in qs], params)
        return len(qs) * num_tokens / (time.perf_counter() - start)


class TransformersSetup:
    """transformers' static batched `generate()`, fp32, on every core: the peer the 32-stream
    figures are a ratio to (the clusters' own weights are the file's, `--weights native`)."""

    name = "transformers generate, fp32"

    def __init__(self) -> None:
        import torch
        from runners import TransformersRunner

        from mohawk_common.model_store import open_model

        torch.set_num_threads(os.cpu_count() or 1)
        source = open_model(None)
        self.runner = TransformersRunner(source, torch.device("cpu"), torch.float32)
        self.tokenizer = source.load_tokenizer()

    def _ids(self, question: str) -> list[int]:
        return encode_chat(self.tokenizer, [{"role": "user", "content": question}])

    def batch1(self, question: str, num_tokens: int) -> Batch1:
        ttft, decode = self.runner.batch1(self._ids(question), num_tokens)
        return Batch1(ttft, decode, [])

    def concurrent(self, qs: Sequence[str], num_tokens: int) -> float:
        return self.runner.concurrent([self._ids(q) for q in qs], num_tokens)


class ClusterSetup:
    def __init__(
        self,
        num_nodes: int,
        data_dir: Path,
        *,
        secure: bool = True,
        backends: Sequence[str] = (),
        prefix_cache: bool = True,
        threads_per_node: int | None = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
        telemetry: bool = False,
        nats_security: bool = False,
        nats_users: bool | None = None,
        model: str | None = None,
    ) -> None:
        """`nats_security`: NATS with a user per process and TLS only, as `mohawk up` runs it
        (`nats_users=False`: TLS only, no users); `model`: a GGUF file (default the bundled model)."""
        self.name = name or f"mohawk up --nodes {num_nodes}"
        spec = ClusterSpec(
            nodes=num_nodes,
            port=free_port(),
            nats_port=free_port(),
            data_dir=data_dir,
            log_level="warning",
            secure=secure,
            backends=tuple(backends),
            threads_per_node=threads_per_node,
            env=({} if prefix_cache else {"MOHAWK_ENABLE_PREFIX_CACHING": "false"}) | (env or {}),
            telemetry=telemetry,
            telemetry_port=free_port() if telemetry else None,
            nats_auth=nats_security if nats_users is None else nats_users,
            nats_tls=nats_security,
            model=model,
        )
        self.cluster = LocalCluster(spec).start()
        self.cluster.wait_ready(timeout=600)
        self.model_name = MODEL
        if model:  # the name the file is served under
            self.model_name = httpx.get(f"{self.cluster.url}/v1/models").json()["data"][0]["id"]

    def close(self) -> None:
        self.cluster.stop()

    def plan(self) -> bus_pb2.Plan | None:
        """The cluster's current plan, as `nats kv get mohawk_plan current` shows it."""

        async def read() -> bus_pb2.Plan | None:
            nc = await connect(
                self.cluster.nats.url,
                name="bench",
                attempts=3,
                creds=self.cluster.nats_creds("ops"),
                tls_ca=self.cluster.nats_tls_ca,
            )
            try:
                return await read_plan((await ensure_buckets(nc.jetstream())).plan)
            finally:
                await nc.close()

        return asyncio.run(read())

    def hop_stats(self) -> tuple[float, float] | None:
        """(median of the nodes' hop medians, worst p99) in ms, from one round of heartbeats."""

        async def collect() -> dict[str, bus_pb2.Heartbeat]:
            nc = await connect(
                self.cluster.nats.url,
                name="bench",
                attempts=3,
                creds=self.cluster.nats_creds("ops"),
                tls_ca=self.cluster.nats_tls_ca,
            )
            sub = await nc.subscribe(names.HEARTBEAT_WILDCARD)
            seen: dict[str, bus_pb2.Heartbeat] = {}
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                try:
                    msg = await sub.next_msg(timeout=max(0.05, deadline - time.monotonic()))
                except Exception:
                    break
                heartbeat = decode_json(bus_pb2.Heartbeat, msg.data)
                seen[heartbeat.node_id] = heartbeat
            await nc.close()
            return seen

        nodes = [h for h in asyncio.run(collect()).values() if h.num_hops > 0]
        if not nodes:
            return None
        return statistics.median(h.hop_ms_p50 for h in nodes), max(h.hop_ms_p99 for h in nodes)

    async def _stream(self, client: httpx.AsyncClient, question: str, num_tokens: int) -> list[float]:
        body = {
            "model": self.model_name,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": num_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        stamps = []
        async with client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    stamps.append(time.perf_counter())
        return stamps

    def batch1(self, question: str, num_tokens: int) -> Batch1:
        async def run() -> Batch1:
            async with httpx.AsyncClient(base_url=self.cluster.url) as client:
                start = time.perf_counter()
                return _batch1(start, await self._stream(client, question, num_tokens))

        return asyncio.run(run())

    def concurrent(self, qs: Sequence[str], num_tokens: int) -> float:
        async def run() -> float:
            limits = httpx.Limits(max_connections=len(qs) + 4)
            async with httpx.AsyncClient(base_url=self.cluster.url, limits=limits) as client:
                start = time.perf_counter()
                await asyncio.gather(*(self._stream(client, q, num_tokens) for q in qs))
                return len(qs) * num_tokens / (time.perf_counter() - start)

        return asyncio.run(run())


def _batch1(start: float, stamps: list[float]) -> Batch1:
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return Batch1(stamps[0] - start, decode, gaps)


def measure(setup: Any, form: Form) -> dict[str, Any]:
    qs = questions(form.num_concurrent)
    setup.batch1(qs[0], 4)  # warm-up
    ttft, decode, concurrent, gaps = [], [], [], []
    for _ in range(form.repeats):
        b1 = setup.batch1(qs[0], form.batch1_tokens)
        ttft.append(b1.ttft_s * 1000)
        decode.append(b1.decode_tps)
        gaps += b1.gaps_s
    hops_idle = setup.hop_stats() if hasattr(setup, "hop_stats") else None
    for _ in range(form.repeats):
        concurrent.append(setup.concurrent(qs, form.concurrent_tokens))
    hops_busy = setup.hop_stats() if hasattr(setup, "hop_stats") else None
    gaps = sorted(gaps) or [float("nan")]  # a peer without a token stream has no gaps
    return {
        "hops_idle_ms": hops_idle,
        "hops_busy_ms": hops_busy,
        "ttft_ms": Stat.of(ttft),
        "decode_tps": Stat.of(decode),
        "concurrent_tps": Stat.of(concurrent),
        "gap_median_ms": statistics.median(gaps) * 1000,
        "gap_p99_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000,
    }


def run(form: Form) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    engine = EngineSetup(form.prefix_cache)
    results[engine.name] = measure(engine, form)
    del engine
    if form.with_transformers:
        peer = TransformersSetup()
        results[peer.name] = measure(peer, form)
        del peer
    for num_nodes in form.node_counts:
        with tempfile.TemporaryDirectory(prefix="mohawk-bench-") as data_dir:
            setup = ClusterSetup(num_nodes, Path(data_dir), prefix_cache=form.prefix_cache)
            try:
                results[setup.name] = measure(setup, form) | {"stages": num_nodes}
            finally:
                setup.close()
    return results


def report(results: dict[str, dict[str, Any]], form: Form) -> str:
    single = results["single process"]["concurrent_tps"].median
    peer_result = results.get(TransformersSetup.name)
    peer = peer_result["concurrent_tps"].median if peer_result else float("nan")
    lines = [
        f"batch-1: {form.batch1_tokens} tokens; concurrent: {form.num_concurrent} streams × "
        f"{form.concurrent_tokens} tokens; medians (min–max) of {form.repeats} run(s); Mohawk's "
        f"prefix cache {'on' if form.prefix_cache else 'off'}",
        "",
        "| setup | TTFT ms | batch-1 decode tok/s | 32-stream aggregate tok/s | × single | × transformers "
        "| token gap median / p99 ms | hop idle median / p99 ms | hop busy median / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ratio, versus_peer = r["concurrent_tps"].median / single, r["concurrent_tps"].median / peer
        lines.append(
            f"| {name} | {r['ttft_ms']} | {r['decode_tps']} | {r['concurrent_tps']} | {ratio:.2f} | "
            f"{versus_peer:.2f} | "
            f"{_gaps(r)} | {_hops(r['hops_idle_ms'])} | "
            f"{_hops(r['hops_busy_ms'])} |"
        )
    return "\n".join(lines)


def _gaps(r: dict[str, Any]) -> str:
    if r["gap_median_ms"] != r["gap_median_ms"]:  # NaN: no stream
        return "–"
    return f"{r['gap_median_ms']:.1f} / {r['gap_p99_ms']:.1f}"


def _hops(stats: tuple[float, float] | None) -> str:
    return "–" if stats is None else f"{stats[0]:.2f} / {stats[1]:.2f}"


def cluster_bench_main(
    argv: Sequence[str] | None,
    doc: str,
    forms: tuple[F, F],
    run: Callable[[F], dict[str, dict[str, Any]]],
    report: Callable[[dict[str, dict[str, Any]], F], str],
) -> int:
    """The command line of a cluster benchmark: `--full` picks the second form, `--json` a file."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="turn Mohawk's prefix cache off: every run recomputes its prompts, as transformers does",
    )
    args = parser.parse_args(argv)
    configure_logging("warning")
    form = forms[1] if args.full else forms[0]
    if args.no_prefix_cache:
        if not hasattr(form, "prefix_cache"):
            parser.error("this benchmark has no prefix-cache switch")
        form = dataclasses.replace(form, prefix_cache=False)  # type: ignore[type-var]
    results = run(form)
    table = report(results, form)
    print(table)
    if args.json:
        plain = {
            name: {k: (v.__dict__ if isinstance(v, Stat) else v) for k, v in r.items()}
            for name, r in results.items()
        }
        write_results(args.json, {"form": form.__dict__, "results": plain}, table, argv)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cluster_bench_main(argv, __doc__ or "", (SHORT, FULL), run, report)


if __name__ == "__main__":
    sys.exit(main())
