"""Where a batch-1 decode step's time goes, native 4-bit weights, bundled model, on CPU.

Runs one stage of all 30 layers on a 200-token context and times a one-token decode forward
(median and min of 40) as it is, with the 4-bit matmuls replaced by empty outputs, and with
attention replaced too, which leaves the small ops (norms, rotary, residuals) and the metadata;
with `batch_invariant` on (the default: attention in fixed chunks) and off (fused attention).
Then times the post-attention half of every layer (o_proj, norm, gate/up, SiLU, down) as plain
tensor calls, eager and under `torch.compile`, against its 4-bit kernels alone.
`python bench/decode_breakdown.py [--threads N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import torch.nn.functional as F

import mohawk_shard.model.blocks as model_blocks
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import open_model
from mohawk_shard.backends.batch import ForwardBatch
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.quantized_layers import Int4Linear

CONTEXT = 200


def timed(fn: Callable[[], Any], runs: int = 40) -> str:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return f"{statistics.median(times) * 1e3:.2f} ms (min {min(times) * 1e3:.2f})"


def forward_breakdown(backend: TorchBackend) -> None:
    backend.allocate_kv_cache(64, 16)
    blocks = list(range(-(-(CONTEXT + 1) // 16)))
    backend.forward(ForwardBatch.build([(list(range(CONTEXT)), 0, blocks, True)], 16), None)
    decode = ForwardBatch.build([([5], CONTEXT, blocks, True)], 16)
    step = lambda: backend.forward(decode, None)  # noqa: E731
    print("decode forward:", timed(step))
    matmul, attention = Int4Linear.forward, model_blocks.paged_attention
    try:
        Int4Linear.forward = lambda self, x: x.new_zeros(*x.shape[:-1], self.out_features)  # type: ignore[method-assign]
        print("  without the 4-bit matmuls:", timed(step))
        model_blocks.paged_attention = lambda q, k, v, cache, meta, options=None: q.new_zeros(
            q.shape[0], q.shape[1] * q.shape[2]
        )  # type: ignore[assignment]
        print("  without matmuls and attention:", timed(step))
    finally:
        Int4Linear.forward, model_blocks.paged_attention = matmul, attention  # type: ignore[method-assign]


def post_attention_breakdown(backend: TorchBackend) -> None:
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    hidden = backend.config.hidden_size

    def post(x: torch.Tensor, attn: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        x = x + mm(attn.bfloat16(), w[0], 32, w[1]).float()
        gate, up = mm(F.rms_norm(x, (hidden,), w[2], 1e-5).bfloat16(), w[3], 32, w[4]).float().chunk(2, -1)
        return x + mm((F.silu(gate) * up).bfloat16(), w[5], 32, w[6]).float()

    layers = []
    for layer in backend.model.layers:
        o, gu, d = layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj
        norm = layer.post_attention_layernorm.weight
        layers.append(
            (o.packed, o.scales_and_zeros, norm, gu.packed, gu.scales_and_zeros, d.packed, d.scales_and_zeros)
        )
    x, attn = torch.randn(1, hidden), torch.randn(1, hidden)
    inner = torch.randn(1, backend.config.intermediate_size).bfloat16()
    compiled = torch.compile(post, dynamic=False, fullgraph=True)
    print(
        "post-attention half, 30 layers, plain tensor calls:",
        timed(lambda: [post(x, attn, *w) for w in layers]),
    )
    print("  the same under torch.compile:", timed(lambda: [compiled(x, attn, *w) for w in layers]))
    kernels = lambda: [  # noqa: E731
        (mm(attn.bfloat16(), w[0], 32, w[1]), mm(x.bfloat16(), w[3], 32, w[4]), mm(inner, w[5], 32, w[6]))
        for w in layers
    ]
    print("  its three 4-bit kernels alone:", timed(kernels))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    source = open_model(None)
    backend = TorchBackend(source, 0, source.config.num_layers, device="cpu", weights="native")
    with torch.inference_mode():
        for invariant in (True, False):
            backend.batch_invariant = invariant
            print(f"batch_invariant={invariant}")
            forward_breakdown(backend)
        post_attention_breakdown(backend)


if __name__ == "__main__":
    main()
