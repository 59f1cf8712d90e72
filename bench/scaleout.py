"""Scale-out benchmark: one pipeline against several replicas of it, 32 concurrent streams, one run.

Each setup is a `mohawk up` cluster of one-thread shard nodes that each hold the whole model
(`--weights native`, the file's own 4-bit weights): `replicas 1` is one node serving alone,
`replicas N` is N such nodes, each its own pipeline, their stage-0 nodes pulling from one request
consumer (least-queue routing). Measured end to end through the gateway's streaming
`/v1/chat/completions`: aggregate output tokens/s of 32 concurrent greedy streams, the median of
--repeats runs with its min–max, and the ratio of each setup to the one-pipeline setup in the same
run. The gateway, NATS and this client share the machine's cores with the nodes, so the ratio on
a 2-core machine is below what two cores of compute alone would give. `python bench/scaleout.py`
runs the short form (CI, `make test`), `--full` the full form (`make bench`); `--replicas 1,2,4`
picks the setups (4 needs 4 spare cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed import ClusterSetup, questions
from engine import Stat
from results_file import write_results

from mohawk_common.bus.pipelines import pipelines
from mohawk_common.logging import configure_logging


@dataclass(frozen=True)
class Form:
    repeats: int
    tokens: int
    num_concurrent: int = 32


SHORT = Form(repeats=1, tokens=12)
FULL = Form(repeats=3, tokens=48)


def replica_setup(replicas: int, data_dir: Path) -> ClusterSetup:
    setup = ClusterSetup(
        replicas,
        data_dir,
        threads_per_node=1,
        env={"MOHAWK_REPLICAS": str(replicas), "MOHAWK_PLACEMENT": "pack", "MOHAWK_WEIGHTS": "native"},
        name=f"replicas {replicas} ({replicas} × 1-thread node)",
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the gateway is ready with one pipeline; wait for all
        plan = setup.plan()
        if plan is not None and sum(p.active for p in pipelines(plan)) == replicas:
            return setup
        time.sleep(0.5)
    setup.close()
    raise RuntimeError(f"{replicas} pipelines did not all become active")


def run(form: Form, replica_counts: list[int]) -> dict[str, dict[str, Any]]:
    qs = questions(form.num_concurrent)
    results: dict[str, dict[str, Any]] = {}
    for replicas in replica_counts:
        with tempfile.TemporaryDirectory(prefix="mohawk-scaleout-") as data_dir:
            setup = replica_setup(replicas, Path(data_dir))
            try:
                setup.concurrent(qs[:4], 4)  # warm-up: both pipelines run a step
                runs = [setup.concurrent(qs, form.tokens) for _ in range(form.repeats)]
                results[setup.name] = {"replicas": replicas, "concurrent_tps": Stat.of(runs)}
            finally:
                setup.close()
    return results


def report(results: dict[str, dict[str, Any]], form: Form) -> str:
    base = next(iter(results.values()))["concurrent_tps"].median
    lines = [
        f"{form.num_concurrent} streams × {form.tokens} tokens, greedy; medians (min–max) of "
        f"{form.repeats} run(s)",
        "",
        f"| setup | {form.num_concurrent}-stream aggregate tok/s | × one pipeline |",
        "|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['concurrent_tps']} | {r['concurrent_tps'].median / base:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--replicas", default="1,2", help="replica counts to compare (default 1,2)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("warning")
    form = FULL if args.full else SHORT
    counts = [int(part) for part in args.replicas.split(",")]
    results = run(form, counts)
    table = report(results, form)
    print(table)
    if args.json:
        plain = {name: {k: getattr(v, "__dict__", v) for k, v in r.items()} for name, r in results.items()}
        write_results(args.json, {"form": form.__dict__, "results": plain}, table, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
