"""K-quants on CUDA: Q4_K through `Int4Linear` and Q6_K/Q5_K/Q5_0/Q5_1 through `GroupwiseLinear` with
bf16 activations, against the decoded weights in fp64; then one 5632 × 2048 matmul timed (1, 32 and
512 rows) as dense bf16, Q4_K, and Q8_0/Q6_K/Q5_K/Q5_0 through the Triton kernel
(`model/groupwise_triton.py`) and through the unpacking path. Random valid blocks, no model file.

Runs on a GPU machine's bare torch image, without the project's dependencies: the two packages'
`__init__` files (which import pydantic, transformers, …) are skipped by registering the packages
as bare namespaces, and only the numpy/torch modules below are imported.
`python3 bench/kquant_cuda.py [cuda|cpu]` from the repository root.
"""

import statistics
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


def stub(name: str, path: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module


stub("mohawk_common", "libs/common/mohawk_common")
stub("mohawk_common.model_store", "libs/common/mohawk_common/model_store")
stub("mohawk_shard", "services/shard-node/mohawk_shard")
stub("mohawk_shard.model", "services/shard-node/mohawk_shard/model")
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks  # noqa: E402
from mohawk_shard.model import groupwise_triton  # noqa: E402
from mohawk_shard.model.groupwise_linear import GroupwiseLinear  # noqa: E402
from mohawk_shard.model.quantized_layers import Int4Linear  # noqa: E402

FP16 = {"Q8_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")


def blocks(type_name, rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    per, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    n = rows * cols // per
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off in FP16[type_name]:
        d = (rng.uniform(0.5, 2, n) * 2.0 ** rng.integers(-13, -11, n)).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n, 2)
    return decode_gguf_blocks(raw.reshape(rows, -1), type_name, (rows, cols))


def layer_for(weight):
    return Int4Linear(weight, device) if weight.source_format == "Q4_K" else GroupwiseLinear(weight, device)


print(torch.__version__, torch.cuda.get_device_name() if device.type == "cuda" else "cpu")
with torch.inference_mode():
    for fmt in ("Q4_K", "Q6_K", "Q5_K", "Q5_0", "Q5_1"):
        w = blocks(fmt, 512, 1024, seed=len(fmt))
        x = torch.randn(7, 1024, dtype=torch.float64)
        ref = x @ torch.from_numpy(w.dequantize()).double().t()
        y = layer_for(w)(x.to(device=device, dtype=torch.bfloat16)).double().cpu()
        print(f"{fmt}: max |y - ref| / max |ref| = {((y - ref).abs().max() / ref.abs().max()).item():.2e}")

    def timed(fn, runs=50):
        """Per call: on CUDA the GPU's time, from a CUDA graph of 10 calls replayed `runs` times
        (launch costs left out, as in a replayed decode step); on CPU the wall clock."""
        for _ in range(5):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(10):
                    fn()
            times = []
            for _ in range(runs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 10)
            return f"{statistics.median(times):.4f} ms ({min(times):.4f}-{max(times):.4f})"
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return f"{statistics.median(times):.3f} ms ({min(times):.3f}-{max(times):.3f})"

    q4k = blocks("Q4_K", 5632, 2048)
    int4 = layer_for(q4k)
    dense = torch.from_numpy(q4k.dequantize()).to(device=device, dtype=torch.bfloat16)
    kernels = {}  # each type through GroupwiseLinear's default (Triton on CUDA) and its unpacking path
    for fmt in ("Q8_0", "Q6_K", "Q5_K", "Q5_0"):
        w = blocks(fmt, 5632, 2048, seed=len(fmt) + 1)
        kernels[fmt] = (GroupwiseLinear(w, device), GroupwiseLinear(w, device, kernel="torch"))
    for rows in (1, 16, 32, 512):
        x = torch.randn(rows, 2048, device=device, dtype=torch.bfloat16)
        print(f"[5632 x 2048], {rows} row(s), bf16, median (min-max) of 50 (CUDA: GPU time a call):")
        print(f"  dense bf16 (2 B/w)                  {timed(lambda x=x: F.linear(x, dense))}")
        print(f"  Int4Linear Q4_K (0.625 B/w)         {timed(lambda x=x: int4(x))}")
        for fmt, (kernel, unpacked) in kernels.items():
            triton = kernel.triton and rows <= groupwise_triton.MAX_ROWS
            held = "Triton" if triton else "int8_rows" if kernel.kernel_weight is not None else "unpacked"
            print(f"  GroupwiseLinear {fmt}, {held:8}       {timed(lambda x=x, k=kernel: k(x))}")
            print(f"  GroupwiseLinear {fmt}, unpacked       {timed(lambda x=x, k=unpacked: k(x))}")

if device.type == "cuda":  # the Triton kernel's pipeline stages
    Tiles = groupwise_triton.Tiles
    for fmt in ("Q6_K", "Q8_0"):
        kernel, unpacked = kernels[fmt]
        for tiles in (Tiles(16, 16, 128, 4, s) for s in (1, 2, 3, 4)):
            groupwise_triton.DECODE = tiles
            cells = []
            for rows in (1, 16):
                x = torch.randn(rows, 2048, device=device, dtype=torch.bfloat16)
                cells.append(f"{rows}: {timed(lambda x=x, k=kernel: k(x), runs=20).split()[0]}")
            print(f"  {fmt} decode {tiles}  " + "  ".join(cells))
        groupwise_triton.DECODE = Tiles(16, 16, 128)
