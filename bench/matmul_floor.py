"""The floor under batch-1 decode: one step's weight matmuls alone, no attention, no engine.

For a model's shapes (default: the bundled SmolLM2-135M), times the q/k/v, o, gate/up and down
matmuls of every layer plus the LM head at batch 1 and 32, in fp32 and bf16, with `F.linear` and
with the weight stored transposed (`x @ Wt`). No engine can decode faster than 1 / floor.
usage: python bench/matmul_floor.py [--model PATH] [--repeats N] [--json OUT]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from results_file import write_results

from mohawk_common.model_store import open_model


def step_matmuls(
    shapes: list[tuple[int, int]], batch: int, dtype: torch.dtype, transposed: bool
) -> Callable[[], None]:
    weights = [torch.randn(out, inp, dtype=dtype) for out, inp in shapes]
    if transposed:
        weights = [w.t().contiguous() for w in weights]
    inputs = {inp: torch.randn(batch, inp, dtype=dtype) for _, inp in shapes}

    def run() -> None:
        for (_, inp), weight in zip(shapes, weights, strict=True):
            torch.matmul(inputs[inp], weight) if transposed else F.linear(inputs[inp], weight)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    config = open_model(args.model).config
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    layer = [(q + 2 * kv, hidden), (hidden, q), (2 * inter, hidden), (hidden, inter)]
    shapes = layer * config.num_layers + [(config.vocab_size, hidden)]
    lines = [
        f"{config.model_id}: {config.num_layers} layers + LM head, {torch.get_num_threads()} threads",
        "| batch | dtype | F.linear ms | x @ Wt ms | decode ceiling tok/s (per sequence) |",
        "|---|---|---|---|---|",
    ]
    print("\n".join(lines))
    rows: list[dict[str, Any]] = []
    for batch in (1, 32):
        for dtype in (torch.float32, torch.bfloat16):
            medians = []
            for transposed in (False, True):
                run = step_matmuls(shapes, batch, dtype, transposed)
                run()
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - start) * 1000)
                medians.append(statistics.median(times))
            name = str(dtype).removeprefix("torch.")
            best = min(medians)
            lines.append(f"| {batch} | {name} | {medians[0]:.1f} | {medians[1]:.1f} | {1000 / best:.0f} |")
            print(lines[-1])
            rows.append({"batch": batch, "dtype": name, "linear_ms": medians[0], "transposed_ms": medians[1]})
    if args.json:
        write_results(args.json, {"model": config.model_id, "rows": rows}, lines)


if __name__ == "__main__":
    main()
