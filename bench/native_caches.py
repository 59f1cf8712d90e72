"""Dense prefill matmuls over every row count a stage meets: kernel caches bounded, rows padded.

Each run is a fresh process (the cache bounds are read when torch first needs them): one layer of
SmolLM2-135M's 4-bit linears (`Int4Linear`: q/k/v, o, gate/up, down) runs `--steps` steps whose
row counts are drawn from 96 to 512, the dense path's range under a 512-token step budget, and the
run prints its time and how much its RSS grew. Three setups, interleaved over `--rounds`:
torch's defaults with exact rows (what the shard did before), the shard's cache bounds with exact
rows, and the bounds with rows padded to `DENSE_ROW_MULTIPLE` (what it does with `batch_invariant`
off; on, no call is dense). Prints the
median and range of each, and the time as a ratio to the first setup in the same round.
`python bench/native_caches.py [--steps 400] [--rounds 3] [--threads 2] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import Stat
from results_file import write_results

from mohawk_shard.native_caches import NATIVE_CACHE_LIMITS

SETUPS = {
    "torch defaults, exact rows": (False, False),
    "caches bounded, exact rows": (True, False),
    "caches bounded, padded rows": (True, True),
}
CHILD = """
import json, random, sys, time
import numpy as np, psutil, torch
from mohawk_common.model_store.quantized import quantize_groupwise
from mohawk_shard.model import quantized_layers
from mohawk_shard.model.quantized_layers import DENSE_MIN_ROWS, Int4Linear, native_bf16_matmul

steps, threads, pad = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
torch.set_num_threads(threads)
if not pad:
    quantized_layers.DENSE_ROW_MULTIPLE = 1
rng = np.random.default_rng(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = [
    Int4Linear(quantize_groupwise(rng.standard_normal(s, dtype=np.float32)), torch.device("cpu"))
    for s in shapes
]
rows = random.Random(0).choices(range(DENSE_MIN_ROWS, 513), k=steps)
inputs = {k: torch.randn(512, k) for k in (576, 1536)}
process = psutil.Process()
start_rss = process.memory_info().rss
start = time.perf_counter()
for n in rows:  # every row dense in one call (batch_invariant off; on, no call is dense)
    with quantized_layers.dense_rows(n):
        for layer in layers:
            layer(inputs[layer.in_features][:n])
seconds = time.perf_counter() - start
grown = (process.memory_info().rss - start_rss) / 2**20
print(json.dumps({"seconds": seconds, "rss_mib": grown, "native_bf16": native_bf16_matmul()}))
"""


def run_one(bounded: bool, padded: bool, steps: int, threads: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in NATIVE_CACHE_LIMITS}
    if bounded:
        env.update(NATIVE_CACHE_LIMITS)
    args = [sys.executable, "-c", CHILD, str(steps), str(threads), "1" if padded else "0"]
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETUPS}
    for _ in range(args.rounds):
        for name, (bounded, padded) in SETUPS.items():
            results[name].append(run_one(bounded, padded, args.steps, args.threads))
    baseline = results[next(iter(SETUPS))]
    if not baseline[0]["native_bf16"]:
        print("this CPU has no native bf16 matmul: the dense path (and oneDNN's caches) never runs")
    limits = ", ".join(f"{k}={v}" for k, v in NATIVE_CACHE_LIMITS.items())
    setup = f"{args.steps} steps of 96–512 rows, {args.threads} threads, {args.rounds} rounds"
    lines = [
        f"{setup}; bounds: {limits}",
        "| setup | time, s | time vs defaults | RSS grown, MiB |",
        "|---|---|---|---|",
    ]
    for name, runs in results.items():
        ratios = Stat.of([r["seconds"] / b["seconds"] for r, b in zip(runs, baseline, strict=True)])
        seconds, rss = Stat.of([r["seconds"] for r in runs]), Stat.of([r["rss_mib"] for r in runs])
        lines.append(f"| {name} | {seconds:.2f} | {ratios:.2f} | {rss:.0f} |")
    print("\n".join(lines))
    if args.json is not None:
        write_results(args.json, {"limits": NATIVE_CACHE_LIMITS, "runs": results}, lines)


if __name__ == "__main__":
    main()
