"""What mirroring a stage's KV to its standby's holder costs while nothing fails (`kv_mirror`).

With warm standbys on, a stage whose layers the next stage's node holds on standby sends that node
each step's KV beside the activations (engine/kv_mirror.py), so that a failover computes none of
it again. This runs the chaos cases' cluster (three shard nodes, standbys on, `mohawk up`'s
processes on this host) on one file `--clusters` times for each side, `kv_mirror` off and on in
turn, and in each, once the standbys are loaded and mirroring has begun, `--repeats` rounds of 16
greedy streams of `--tokens` tokens each; a round's figure is its tokens over its wall time, from
the first request to the last token. Each side's median and min-max over all its rounds, and
on/off as the ratio (same file, same machine). Each cluster's planner splits the layers by the
speeds its nodes measure at start, and a split changes the pipeline's speed as much as anything
here: the splits are recorded beside the figures.

usage: python bench/mirror_cost.py [--files bundled,smollm2-1.7b:Q4_K_M] [--clusters 2]
                                   [--repeats 3] [--tokens 48] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for the chaos cluster

from real_files import stat
from real_shapes import model_file
from results_file import write_results

from mohawk_cli.cluster import LocalCluster
from mohawk_common.logging import configure_logging
from tests.chaos.clusters import chaos_spec, events, standby_held_for, streams_through
from tests.integration.cluster_helpers import wait_for_stages

NUM_STREAMS = 16
BOUND_S = 600.0


def wait_mirroring(cluster: LocalCluster, node_id: str, timeout: float) -> None:
    """Until `node_id`'s stage mirrors its KV (it starts SETTLE_S after the plan asks)."""
    deadline = time.monotonic() + timeout
    while not events(cluster, node_id, "kv mirrored to the next stage's standby"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{node_id} never began mirroring its KV")
        time.sleep(0.25)


def rounds(path: Path | None, mirror: bool, repeats: int, tokens: int) -> tuple[list[float], list[int]]:
    """Tokens per second of each round of 16 streams, `kv_mirror` on or off, and the layers of
    each stage of the cluster's plan."""
    with tempfile.TemporaryDirectory(prefix="mirror-cost-") as scratch:
        spec = chaos_spec(
            Path(scratch),
            3,
            MOHAWK_STANDBYS="true",
            MOHAWK_KV_MIRROR=str(mirror).lower(),
            MOHAWK_SERVED_MODEL_NAME="smollm2-135m-instruct",  # the name the streams ask for
        )
        if path is not None:
            spec = dataclasses.replace(spec, model=str(path))
        with LocalCluster(spec) as cluster:
            cluster.wait_ready(timeout=BOUND_S)
            plan = wait_for_stages(cluster, 3, timeout=BOUND_S)
            split = [s.end - s.start for s in plan.stages]
            middle = plan.stages[1].node_id
            standby_held_for(cluster, middle, BOUND_S)
            if mirror:
                wait_mirroring(cluster, middle, BOUND_S)
            streams_through(cluster, lambda: None, NUM_STREAMS, BOUND_S, max_tokens=tokens)  # warm-up
            figures = []
            for _ in range(repeats):
                started = time.perf_counter()
                done, _ = streams_through(cluster, lambda: None, NUM_STREAMS, BOUND_S, max_tokens=tokens)
                assert all(finish in ("stop", "length") for _, (_, finish) in done)
                figures.append(NUM_STREAMS * tokens / (time.perf_counter() - started))
            return figures, split


def measure(path: Path | None, clusters: int, repeats: int, tokens: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"kv_mirror off, tokens/s": [], "kv_mirror on, tokens/s": []}
    splits: dict[str, list[list[int]]] = {"off": [], "on": []}
    for _ in range(clusters):
        for mirror in (False, True):
            figures, split = rounds(path, mirror, repeats, tokens)
            runs[f"kv_mirror {'on' if mirror else 'off'}, tokens/s"] += figures
            splits["on" if mirror else "off"].append(split)
    stats = {key: stat(values) for key, values in runs.items()}
    on, off = stats["kv_mirror on, tokens/s"]["median"], stats["kv_mirror off, tokens/s"]["median"]
    return {
        "streams": NUM_STREAMS,
        "tokens": tokens,
        "splits": splits,
        "runs": runs,
        "stats": stats,
        "ratios": {"on / off": on / off},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", default="bundled,smollm2-1.7b:Q4_K_M")
    parser.add_argument("--clusters", type=int, default=2, help="clusters started for each side")
    parser.add_argument("--repeats", type=int, default=3, help="rounds in each cluster")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_logging("warning", json=False)
    results: dict[str, Any] = {}
    lines = [
        "| file | kv_mirror off, tokens/s | kv_mirror on, tokens/s | on / off | splits off; on |",
        "|---|---|---|---|---|",
    ]
    for name in args.files.split(","):
        path = None if name == "bundled" else model_file(*name.split(":"))
        figures = measure(path, args.clusters, args.repeats, args.tokens)
        results[name] = figures
        cells = [
            f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"
            for s in (figures["stats"]["kv_mirror off, tokens/s"], figures["stats"]["kv_mirror on, tokens/s"])
        ]
        splits = "; ".join(
            " ".join("/".join(map(str, s)) for s in figures["splits"][k]) for k in ("off", "on")
        )
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {figures['ratios']['on / off']:.3f} | {splits} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.json is not None:
        write_results(args.json, results, lines)


if __name__ == "__main__":
    main()
