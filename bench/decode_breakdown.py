"""Where a batch-1 decode step's time goes, native 4-bit weights, bundled model, on CPU.

Runs one stage of all 30 layers on a 200-token context and times a one-token decode forward
(median and min of 40) as it is, with the 4-bit matmuls replaced by empty outputs, and with
attention replaced too, which leaves the small ops (norms, rotary, residuals) and the metadata;
with `batch_invariant` on (the default: attention in fixed chunks) and off (fused attention).
With the setting on, the same step replayed from its TorchScript trace (`model/traced_decode.py`,
what the engine runs once a context bucket has served 32 decodes). Then the floor: one step's
4-bit matmuls alone (every layer's q/k/v, o, gate/up and down and the LM head's, fp32 rows in and
out, nothing else), on the row-block kernel the engine uses where it builds (`kernels/int4_rows.py`:
int8 rows inside, as llama.cpp's) and on torch's tinygemm with the same weights, at 1 row and at
8, 32 and 128 (a batched decode, a prefill chunk), against llama.cpp's whole decode step on the
same GGUF with the same threads, in the same run (when llama-cpp-python, the bench extra, is
installed). Last, the post-attention half of every layer (o_proj, norm, gate/up, SiLU, down) as
plain tensor calls: eager, compiled one layer a call, and all 30 layers compiled as one graph with
Inductor's freezing and C++ wrapper, against its 4-bit kernels alone.
`python bench/decode_breakdown.py [--threads N] [--no-compile] [--json FILE]`; `--json` saves every
row it printed (median and min, ms) as a stamped result file (`bench/results_file.py`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import torch.nn.functional as F

import mohawk_shard.model.blocks as model_blocks
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import open_model
from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.quantized_layers import Int4Linear

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results

CONTEXT = 200
ROWS: list[dict[str, Any]] = []  # every timed row printed, for --json


def show(label: str, fn: Callable[[], Any], runs: int = 40) -> None:
    """Print the median and min (ms) of `runs` calls after 5 warm-ups, and keep the row for --json."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    record(label, times)


def record(label: str, seconds: list[float]) -> None:
    median, fastest = statistics.median(seconds) * 1e3, min(seconds) * 1e3
    print(f"{label} {median:.2f} ms (min {fastest:.2f})")
    row = {"what": label.strip().rstrip(":"), "median_ms": round(median, 3), "min_ms": round(fastest, 3)}
    ROWS.append(row | {"runs": len(seconds)})


def forward_breakdown(backend: TorchBackend) -> None:
    backend.allocate_kv_cache(64, 16)
    blocks = list(range(-(-(CONTEXT + 1) // 16)))
    backend.forward(ForwardBatch.build([(list(range(CONTEXT)), 0, blocks, True)], 16), None)
    decode = ForwardBatch.build([([5], CONTEXT, blocks, True)], 16)
    step = lambda: backend.forward(decode, None)  # noqa: E731
    traced, backend.traced_decode = backend.traced_decode, None  # eager, to take apart
    show(f"batch_invariant={backend.batch_invariant}: decode forward:", step)
    matmul, attention = Int4Linear.forward, model_blocks.paged_attention
    try:
        Int4Linear.forward = lambda self, x: x.new_zeros(*x.shape[:-1], self.out_features)  # type: ignore[method-assign]
        show("  without the 4-bit matmuls:", step)
        model_blocks.paged_attention = lambda q, k, v, cache, meta, options=None: q.new_zeros(
            q.shape[0], q.shape[1] * q.shape[2]
        )  # type: ignore[assignment]
        show("  without matmuls and attention:", step)
    finally:
        Int4Linear.forward, model_blocks.paged_attention = matmul, attention  # type: ignore[method-assign]
        backend.traced_decode = traced
    if traced is not None and backend.batch_invariant:  # the default for a long answer's decodes
        traced.trace_after = 1
        show("decode forward replayed from its trace (same bits):", step)


def tinygemm_copy(layer: Int4Linear) -> Int4Linear:
    """The same 4-bit weight on torch's tinygemm kernel (bf16 scales and zeros), for comparison."""
    if not layer.row_kernel:
        return layer
    codes = layer.row_codes(torch.arange(layer.out_features)).numpy()
    scales, mins = (
        t.float().transpose(1, 2).reshape(layer.out_features, -1).numpy()
        for t in (layer.row_scales, layer.row_mins)
    )
    weight = GroupQuantized(codes, scales, mins, 4, layer.group_size, layer.source_format)
    return Int4Linear(weight, torch.device("cpu"), kernel="tinygemm")


def post_attention_breakdown(backend: TorchBackend) -> None:
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    hidden = backend.config.hidden_size

    def post(x: torch.Tensor, attn: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        x = x + mm(attn.bfloat16(), w[0], 32, w[1]).float()
        gate, up = mm(F.rms_norm(x, (hidden,), w[2], 1e-5).bfloat16(), w[3], 32, w[4]).float().chunk(2, -1)
        return x + mm((F.silu(gate) * up).bfloat16(), w[5], 32, w[6]).float()

    layers = []
    for layer in backend.model.layers:
        o, gu, d = (
            tinygemm_copy(m) for m in (layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        )
        norm = layer.post_attention_layernorm.weight
        layers.append(
            (o.packed, o.scales_and_zeros, norm, gu.packed, gu.scales_and_zeros, d.packed, d.scales_and_zeros)
        )
    x, attn = torch.randn(1, hidden), torch.randn(1, hidden)
    inner = torch.randn(1, backend.config.intermediate_size).bfloat16()
    compiled = torch.compile(post, dynamic=False, fullgraph=True)
    show("post-attention half, 30 layers, plain tensor calls:", lambda: [post(x, attn, *w) for w in layers])
    show("  the same, each layer a torch.compile call:", lambda: [compiled(x, attn, *w) for w in layers])

    class PostHalves(torch.nn.Module):
        """The 30 post-attention halves chained into one graph, the weights its buffers."""

        def __init__(self) -> None:
            super().__init__()
            for i, w in enumerate(layers):
                for j, tensor in enumerate(w):
                    self.register_buffer(f"w{i}_{j}", tensor)

        def forward(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
            for i in range(len(layers)):
                x = post(x, attn, *(getattr(self, f"w{i}_{j}") for j in range(7)))
            return x

    eager = PostHalves().eval()
    with torch._inductor.config.patch(freezing=True, cpp_wrapper=True):
        start = time.perf_counter()
        frozen = torch.compile(eager, dynamic=False, fullgraph=True)
        verdict = "bit-equal to" if torch.equal(frozen(x, attn), eager(x, attn)) else "differs from"
        took = time.perf_counter() - start
        how = f"Inductor freezing + C++ wrapper ({took:.0f} s to compile, {verdict} eager)"
        label = f"  all 30 as one graph, {how}:"
        show(label, lambda: frozen(x, attn))
    kernels = lambda: [  # noqa: E731
        (mm(attn.bfloat16(), w[0], 32, w[1]), mm(x.bfloat16(), w[3], 32, w[4]), mm(inner, w[5], 32, w[6]))
        for w in layers
    ]
    show("  its three 4-bit kernels alone:", kernels)


def kernel_floor(backend: TorchBackend, threads: int) -> None:
    """One step's 4-bit kernel calls alone, against llama.cpp's whole step in the same run."""
    linears = [m for m in backend.model.modules() if isinstance(m, Int4Linear)]
    kernels = {
        "the row kernel (int8 rows)": linears,
        "tinygemm (bf16 rows)": [tinygemm_copy(m) for m in linears],
    }
    if not any(m.row_kernel for m in linears):
        kernels = {"tinygemm (bf16 rows)": linears}  # the row kernel does not run here
    for name, layers in kernels.items():
        rows = {m.in_features: torch.randn(1, m.in_features) for m in layers}
        floor = lambda layers=layers, rows=rows: [m(rows[m.in_features]) for m in layers]  # noqa: E731
        show(f"one step's {len(layers)} 4-bit matmuls alone, {name} (the floor):", floor)
        for num_rows in (8, 32, 128):  # batched decode and prefill: the cost grows with the rows
            many = {k: torch.randn(num_rows, k) for k in rows}
            every = lambda layers=layers, many=many: [m(many[m.in_features]) for m in layers]  # noqa: E731
            show(f"  the same at {num_rows} rows:", every, runs=8)
    from runners import LlamaCppRunner, llama_cpp_version  # the bench's runners, when llama.cpp is wanted

    if llama_cpp_version() is None:
        print("llama.cpp's whole step: llama-cpp-python is not installed (`make bench` installs it)")
        return
    llama = LlamaCppRunner(open_model(None).path, threads)
    steps = []
    for _ in range(5):
        _, tokens_per_s = llama.batch1(list(range(1, CONTEXT + 1)), 65)
        steps.append(1 / tokens_per_s)
    record(f"llama.cpp's whole decode step ({CONTEXT}-token context, 64 steps, median of 5):", steps)


def table() -> str:
    lines = ["| what | median, ms | min, ms |", "|---|---|---|"]
    lines += [f"| {row['what']} | {row['median_ms']:.2f} | {row['min_ms']:.2f} |" for row in ROWS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true", help="leave out the Inductor compile (minutes)")
    parser.add_argument("--json", type=Path, help="also write the rows here, stamped")
    args = parser.parse_args(argv)
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    source = open_model(None)
    backend = TorchBackend(source, 0, source.config.num_layers, device="cpu", weights="native")
    with torch.inference_mode():
        for invariant in (True, False):
            backend.batch_invariant = invariant
            forward_breakdown(backend)
        kernel_floor(backend, args.threads)
        if not args.no_compile:
            post_attention_breakdown(backend)
    if args.json:
        figures = {"threads": args.threads, "context": CONTEXT, "rows": ROWS}
        write_results(args.json, figures, table(), argv)


if __name__ == "__main__":
    main()
