"""How to hold GGUF's 5-, 6- and 8-bit formats in a torch stage: kernels timed by speed and bytes.

For each shape ([out, in] = 5632 × 2048, a 1B model's gate/up, and 1536 × 576, SmolLM2's) and
each row count (1: a decode step; 512: a prefill chunk) this times one matmul `y = x·Wᵀ` held as:
`dense fp32` (today's CPU fallback, weight stored transposed as the dense CPU path keeps it),
`dense bf16`, `int4 tinygemm` (the Q4_x/Q4_K path, for reference), `int8 unpack whole` (int8
codes and per-group scales and minimums, the whole matrix unpacked to the compute dtype each
call, then a dense matmul: fp32 and bf16), `GroupwiseLinear` (the same codes unpacked a
cache-sized slice of rows at a time into one buffer, what the stage runs: groups of 16 with
scales, as Q6_K, and of 32 with scales and minimums, as Q5_K), `split int4` (a 5- or 8-bit code
as two 4-bit matrices, `lo + 16·hi`, two tinygemm calls; groups of 32 only: tinygemm refuses
16), and `int8pack per-channel` (torch's `_weight_int8pack_mm`, one scale per output row: it
would requantize a groupwise file, so it is listed only as the floor it would buy). Prints the
median and spread (min–max) of `--runs` calls in ms, and the held bytes per weight.
`python bench/kquant_kernels.py [--threads N] [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.model.groupwise_linear import GroupwiseLinear

SHAPES = [(5632, 2048), (1536, 576)]  # [out, in]
ROWS = [1, 512]
GROUP = 32
int4_mm = torch.ops.aten._weight_int4pack_mm_for_cpu


def timed(fn: Callable[[], object], runs: int) -> str:
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return f"{statistics.median(times):8.2f} ms ({min(times):.2f}–{max(times):.2f})"


def int4_weight(out_features: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 8 if in_features % 256 == 0 else 2)
    pairs = torch.randn(in_features // GROUP, out_features, 2).bfloat16()
    return packed, pairs


Candidate = tuple[Callable[[], object], float]


def candidates(out_features: int, in_features: int, x: torch.Tensor) -> dict[str, Candidate]:
    """name -> (one call, held bytes per weight)."""
    dense = torch.randn(out_features, in_features)
    transposed = dense.t().contiguous()
    half = dense.bfloat16()
    codes = torch.randint(-32, 32, (out_features, in_features), dtype=torch.int8)
    groups = in_features // GROUP
    scales = torch.rand(out_features, groups, 1)
    mins = torch.rand(out_features, groups, 1)
    lo, hi = int4_weight(out_features, in_features), int4_weight(out_features, in_features)
    xb = x.bfloat16()

    def unpack(dtype: torch.dtype) -> Callable[[], object]:
        s, m = scales.to(dtype), mins.to(dtype)
        xd = x.to(dtype)

        def call() -> object:
            w = codes.view(out_features, groups, GROUP).to(dtype).mul_(s).add_(m)
            return F.linear(xd, w.view(out_features, in_features))

        return call

    def groupwise(group: int, with_mins: bool) -> Callable[[], object]:
        rng = np.random.default_rng(0)
        shape = (out_features, in_features // group)
        layer = GroupwiseLinear(
            GroupQuantized(
                codes.numpy(),
                rng.random(shape, dtype=np.float32),
                rng.random(shape, dtype=np.float32) if with_mins else None,
                6,
                group,
                "bench",
            ),
            torch.device("cpu"),
        )
        return lambda: layer(x)

    channel = torch.rand(out_features).bfloat16()
    pair_bytes = 4 / GROUP  # a bf16 scale and zero per group
    return {
        "dense fp32": (lambda: x @ transposed, 4.0),
        "dense bf16": (lambda: F.linear(xb, half), 2.0),
        "int4 tinygemm": (lambda: int4_mm(xb, lo[0], GROUP, lo[1]), 0.5 + pair_bytes),
        "int8 unpack whole fp32": (unpack(torch.float32), 1 + 8 / GROUP),
        "int8 unpack whole bf16": (unpack(torch.bfloat16), 1 + 4 / GROUP),
        "GroupwiseLinear g16": (groupwise(16, with_mins=False), 1 + 4 / 16),
        "GroupwiseLinear g32+min": (groupwise(32, with_mins=True), 1 + 8 / 32),
        "split int4": (
            lambda: int4_mm(xb, lo[0], GROUP, lo[1]) + int4_mm(xb, hi[0], GROUP, hi[1]),
            2 * (0.5 + pair_bytes),
        ),
        "int8pack per-channel": (lambda: torch._weight_int8pack_mm(xb, codes, channel), 1.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} thread(s), median (min–max) of {args.runs}")
    print(f"{os.cpu_count()} CPUs, load average {load} (other work on the machine skews the figures)")
    with torch.inference_mode():
        for out_features, in_features in SHAPES:
            for num_rows in ROWS:
                x = torch.randn(num_rows, in_features)
                print(f"[{out_features} x {in_features}], {num_rows} row(s):")
                for name, (call, per_weight) in candidates(out_features, in_features, x).items():
                    print(f"  {name:24s} {timed(call, args.runs)}  {per_weight:.3f} B/weight")


if __name__ == "__main__":
    main()
