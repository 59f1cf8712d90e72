"""Loading a GGUF, Mohawk against llama.cpp: process start to the first token of a 4-token prompt,
and the process's peak RSS, each run a fresh process, with the same small context on both
(`--ctx` tokens: Mohawk's KV cache capped at `max_model_len`, llama.cpp's `n_ctx`) and the same
threads. One unmeasured run of each first (the file in the page cache, Mohawk's metadata cache
filled, as after any earlier start), then `--runs` interleaved; median and min-max of each.

usage: python bench/load.py FILE [--runs 5] [--json PATH]   (FILE: e.g. bench/real_shapes.py's)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results_file import write_results

# the process's own peak (VmHWM, kB): ru_maxrss keeps the peak of the process that spawned it
# across exec, so a bench holding a big engine or a quantizer's buffers would lend it its own
_PEAK_KB = 'next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))'

_MOHAWK = f"""
import sys
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine
path, ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
settings = EngineSettings(
    model=path, device="cpu", num_threads=threads, max_model_len=ctx, kv_cache_memory_mb=64
)
engine = build_local_engine(settings, ())
engine.add_request("load", [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
for _ in engine.run():
    break
print("FIRST", {_PEAK_KB}, flush=True)
"""

_LLAMA_CPP = f"""
import sys
from llama_cpp import Llama
path, ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_batch=ctx, verbose=False)
for _ in llm.generate([1, 2, 3, 4], temp=0.0):
    break
print("FIRST", {_PEAK_KB}, flush=True)
"""


def one(script: str, path: Path, ctx: int, threads: int) -> tuple[float, float]:
    """Seconds from spawning the process to its first token, and its peak RSS in GB."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(ctx), str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("FIRST"):
            elapsed = time.perf_counter() - started
            child.wait(timeout=120)
            return elapsed, int(line.split()[1]) / 1024**2
    raise RuntimeError(f"no first token (exit {child.wait(timeout=120)})")


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _cell(figure: dict[str, float]) -> str:
    return f"{figure['median']:.2f} ({figure['min']:.2f}–{figure['max']:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sides = {"mohawk": _MOHAWK, "llama.cpp": _LLAMA_CPP}
    for script in sides.values():
        one(script, args.file, args.ctx, args.threads)  # page cache and metadata cache warm
    runs: dict[str, dict[str, list[float]]] = {name: {"seconds": [], "rss_gb": []} for name in sides}
    for _ in range(args.runs):
        for name, script in sides.items():
            seconds, rss = one(script, args.file, args.ctx, args.threads)
            runs[name]["seconds"].append(seconds)
            runs[name]["rss_gb"].append(rss)
    figures: dict[str, Any] = {
        name: {key: summary(values) for key, values in measured.items()} for name, measured in runs.items()
    }
    figures["ratios"] = {
        key: figures["mohawk"][key]["median"] / figures["llama.cpp"][key]["median"]
        for key in ("seconds", "rss_gb")
    }
    lines = [
        f"load: {args.file.name}, {args.runs} fresh processes a side, interleaved, ctx {args.ctx}, "
        f"{args.threads} threads",
        "",
        "| side | start to first token, s | peak RSS, GB |",
        "|---|---|---|",
    ]
    for name in sides:
        seconds, rss = (_cell(figures[name][key]) for key in ("seconds", "rss_gb"))
        lines.append(f"| {name} | {seconds} | {rss} |")
    ratios = figures["ratios"]
    lines.append(f"| Mohawk / llama.cpp | {ratios['seconds']:.2f}× | {ratios['rss_gb']:.2f}× |")
    table = "\n".join(lines)
    print(table)
    if args.json:
        write_results(args.json, {"file": args.file.name, "runs": runs, **figures}, table)


if __name__ == "__main__":
    main()
