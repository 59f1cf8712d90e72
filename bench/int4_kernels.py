"""torch's CPU 4-bit kernel against dense matmuls, at SmolLM2-135M's shapes, batch 1.

Times (median of 15, 1 thread by default) the weight matmuls of one decode step: the 30 layers'
q/k/v, o, gate/up and down with distinct weights per layer (so they stream from memory as in a
real step), as fp32 (weights stored transposed, the dense CPU path), bf16, and 4-bit tinygemm
with bf16, fp16 and fp32 activations; then the 49152 × 576 LM head as fp32, bf16 and 4-bit.
`python bench/int4_kernels.py [--threads N]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [out, in]
NUM_LAYERS, VOCAB, HIDDEN, GROUP = 30, 49152, 576, 32
mm = torch.ops.aten._weight_int4pack_mm_for_cpu


def timed(fn: Callable[[], object], runs: int = 15) -> str:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return f"{statistics.median(times) * 1e3:.2f} ms"


def int4(out_features: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
    pairs = torch.randn(in_features // GROUP, out_features, 2)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2), pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    torch.set_num_threads(parser.parse_args().threads)
    shapes = LAYER_SHAPES * NUM_LAYERS
    dense = [torch.randn(n, k) for n, k in shapes]
    transposed = [w.t().contiguous() for w in dense]
    halves = [w.bfloat16() for w in dense]
    packed = [int4(n, k) for n, k in shapes]
    inputs = {k: torch.randn(1, k) for _, k in shapes}

    def step_int4(dtype: torch.dtype) -> Callable[[], object]:
        cast = {k: x.to(dtype) for k, x in inputs.items()}
        pairs = [(p, s.to(dtype)) for p, s in packed]
        return lambda: [mm(cast[k], p, GROUP, s) for (_, k), (p, s) in zip(shapes, pairs, strict=True)]

    with torch.inference_mode():
        print("30 layers' matmuls, batch 1:")
        print(
            "  fp32 (transposed):",
            timed(lambda: [inputs[k] @ w for (_, k), w in zip(shapes, transposed, strict=True)]),
        )
        bf16_inputs = {k: x.bfloat16() for k, x in inputs.items()}
        print(
            "  bf16:",
            timed(lambda: [F.linear(bf16_inputs[k], w) for (_, k), w in zip(shapes, halves, strict=True)]),
        )
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            print(
                f"  4-bit, {str(dtype).removeprefix('torch.')} activations:", timed(step_int4(dtype), runs=3)
            )
        head, x = torch.randn(VOCAB, HIDDEN), torch.randn(1, HIDDEN)
        head_t, head_bf16, (head_packed, head_pairs) = (
            head.t().contiguous(),
            head.bfloat16(),
            int4(VOCAB, HIDDEN),
        )
        head_pairs = head_pairs.bfloat16()
        print("LM head, batch 1:")
        print("  fp32 (transposed):", timed(lambda: x @ head_t))
        print("  bf16:", timed(lambda: F.linear(x.bfloat16(), head_bf16)))
        print("  4-bit:", timed(lambda: mm(x.bfloat16(), head_packed, GROUP, head_pairs)))


if __name__ == "__main__":
    main()
