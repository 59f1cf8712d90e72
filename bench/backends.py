"""Backends benchmark: torch-only, MLX-only and mixed torch/MLX pipelines in one run, with the plan each got.

Each setup is a local cluster (`mohawk up --nodes N --backends ...`) measured end to end through the
gateway's streaming API, like bench/distributed.py: batch-1 decode tokens/s and the aggregate
tokens/s of concurrent streams, medians (min–max) of --repeats runs, and the layers the planner gave
each node from its measured speed. MLX on a Linux CPU runs on a reference BLAS (the mlx-cpu wheel):
it is here for correctness and for mixing; its speed home is Apple Silicon.
`python bench/backends.py` runs the short form (CI, `make test`: the mixed pipeline only, one short
run); `--full` the full form (`make bench`: all three pipelines).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed import ClusterSetup, cluster_bench_main, questions
from engine import Stat

from mohawk_common.bus.control import decode_json
from mohawk_proto.v1 import bus_pb2

SETUPS = {
    "torch, torch": ("torch", "torch"),
    "mlx, mlx": ("mlx", "mlx"),
    "torch, mlx, torch": ("torch", "mlx", "torch"),
}


@dataclass(frozen=True)
class Form:
    setups: tuple[str, ...]
    repeats: int
    batch1_tokens: int
    concurrent_tokens: int
    num_concurrent: int


SHORT = Form(("torch, mlx, torch",), repeats=1, batch1_tokens=8, concurrent_tokens=8, num_concurrent=8)
FULL = Form(tuple(SETUPS), repeats=2, batch1_tokens=32, concurrent_tokens=24, num_concurrent=16)


def measure(setup: ClusterSetup, form: Form) -> dict[str, Any]:
    qs = questions(form.num_concurrent)
    setup.batch1(qs[0], 4)  # warm-up
    decode, concurrent = [], []
    for _ in range(form.repeats):
        decode.append(setup.batch1(qs[0], form.batch1_tokens).decode_tps)
        concurrent.append(setup.concurrent(qs, form.concurrent_tokens))
    return {"decode_tps": Stat.of(decode), "concurrent_tps": Stat.of(concurrent)}


def run(form: Form) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in form.setups:
        backends = SETUPS[name]
        with tempfile.TemporaryDirectory(prefix="mohawk-backends-") as data_dir:
            setup = ClusterSetup(len(backends), Path(data_dir), backends=backends)
            try:
                results[name] = measure(setup, form) | {"plan": current_plan(setup)}
            finally:
                setup.close()
    return results


def current_plan(setup: ClusterSetup) -> list[list[Any]]:
    """[node, backend, first layer, end layer] of each stage of the active plan."""
    import asyncio

    from mohawk_common.bus.connect import connect
    from mohawk_common.bus.control import read_plan
    from mohawk_common.bus.setup import ensure_buckets

    async def read() -> tuple[bus_pb2.Plan | None, dict[str, str]]:
        nc = await connect(setup.cluster.nats.url, name="bench", attempts=3)
        try:
            buckets = await ensure_buckets(nc.jetstream())
            backends = {}
            for key in await buckets.nodes.keys():
                entry = await buckets.nodes.get(key)
                heartbeat = decode_json(bus_pb2.Heartbeat, entry.value or b"{}")
                backends[heartbeat.node_id] = (
                    f"{heartbeat.backend} {heartbeat.seconds_per_layer * 1e3:.2f} ms/layer"
                )
            return await read_plan(buckets.plan), backends
        finally:
            await nc.close()

    plan, backends = asyncio.run(read())
    if plan is None:
        return []
    return [[s.node_id, backends.get(s.node_id, "?"), s.start, s.end] for s in plan.stages]


def report(results: dict[str, dict[str, Any]], form: Form) -> str:
    lines = [
        f"batch-1: {form.batch1_tokens} tokens; concurrent: {form.num_concurrent} streams × "
        f"{form.concurrent_tokens} tokens; medians (min–max) of {form.repeats} run(s)",
        "",
        "| pipeline | batch-1 decode tok/s | concurrent aggregate tok/s "
        "| plan: node (backend, measured speed): layers |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        plan = "; ".join(f"{n} ({b}): [{s}, {e})" for n, b, s, e in r["plan"])
        lines.append(f"| {name} | {r['decode_tps']} | {r['concurrent_tps']} | {plan} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return cluster_bench_main(argv, __doc__ or "", (SHORT, FULL), run, report)


if __name__ == "__main__":
    sys.exit(main())
