"""The files people download, at the sizes they run: Mohawk against llama.cpp, same file, same run.

For each file (random weights of a real model's shape, quantized by llama.cpp's own quantizer:
`real_shapes.py`), with the same threads on both sides and runs interleaved:
  * batch-1 decode tokens/s of one greedy request (`--tokens` tokens after a 20-token prompt);
  * the first token of a 512-token prompt, seconds;
  * 32 concurrent requests of mixed prompt lengths (8-40 tokens, 64 tokens each): aggregate output
    tokens/s, against llama.cpp's own 32-sequence batch (`llama_cpp_batch.py`);
  * loading: process start to the first token and peak RSS, fresh processes (`load.py`).
Each figure is the median of the form's runs with its min-max; the ratio is Mohawk's median over
llama.cpp's. Before the batch-1 runs each side runs one request of each measured shape, as
`pipeline_cost.py` does (the engine traces its batch-1 decode steps after a few eager ones, a cost
the load figure's first token shows; llama.cpp needs no warm-up and gets it all the same), and
before the 32-stream runs one pass of them (each batch size and context bucket of the engine runs
16 eager steps before it is traced, so a first pass ran 0.86x its second: 88.6 against 103.2
tok/s at 9b77278; llama.cpp's batch gets its pass too). The
short form runs SmolLM2-1.7B's and Gemma 3 270M's shapes in Q4_K_M; `--full`
(`make bench`) also the 1.7B's Q5_K_M, Q6_K and Q8_0, Llama-3.2-3B's shape in Q4_K_M and
Llama-3.1-8B's and Qwen3-30B-A3B's (4 layers) in Q4_K_M; `--files SHAPE:TYPE,...` any of them.

usage: python bench/real_files.py [--full | --files gemma-3-270m:Q4_K_M] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from llama_cpp_batch import LlamaCppBatch
from load import _LLAMA_CPP, _MOHAWK, one
from real_shapes import model_file
from results_file import write_results
from runners import LlamaCppRunner, MohawkRunner

from mohawk_common.logging import configure_logging
from mohawk_common.model_store import open_model
from mohawk_shard.config import EngineSettings

SHORT_FILES = [("smollm2-1.7b", "Q4_K_M"), ("gemma-3-270m", "Q4_K_M")]
FULL_FILES = [
    *SHORT_FILES,
    ("smollm2-1.7b", "Q5_K_M"),
    ("smollm2-1.7b", "Q6_K"),
    ("smollm2-1.7b", "Q8_0"),
    ("llama-3.2-3b", "Q4_K_M"),
    ("llama-3.1-8b", "Q4_K_M"),
    ("qwen3-30b-a3b-4l", "Q4_K_M"),
]


@dataclass(frozen=True)
class Form:
    repeats: int
    batch1_tokens: int
    concurrent_repeats: int
    load_runs: int


SHORT = Form(repeats=3, batch1_tokens=65, concurrent_repeats=2, load_runs=3)
FULL = Form(repeats=4, batch1_tokens=129, concurrent_repeats=3, load_runs=5)


def stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_file(path: Path, form: Form, threads: int) -> dict[str, Any]:
    """Every figure of one file, Mohawk's and llama.cpp's, and their ratios."""
    runs: dict[str, dict[str, list[float]]] = {side: {} for side in ("mohawk", "llama.cpp")}

    def add(side: str, key: str, value: float) -> None:
        runs[side].setdefault(key, []).append(value)

    for script in (_MOHAWK, _LLAMA_CPP):
        one(script, path, 256, threads)  # the file in the page cache, the metadata cache filled
    for _ in range(form.load_runs):
        for side, script in (("mohawk", _MOHAWK), ("llama.cpp", _LLAMA_CPP)):
            seconds, rss = one(script, path, 256, threads)
            add(side, "load_s", seconds)
            add(side, "rss_gb", rss)
    source = open_model(path)
    # no prefix cache: every run computes its prompt, as llama.cpp's does
    settings = EngineSettings(
        model=str(path),
        device="cpu",
        num_threads=threads,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
    )
    mohawk, llama = MohawkRunner(settings, source), LlamaCppRunner(path, threads)
    rng = random.Random(0)
    short_prompt = [rng.randrange(100, 40000) for _ in range(20)]
    long_prompt = [rng.randrange(100, 40000) for _ in range(512)]
    for runner in (mohawk, llama):  # the warm-up (module docstring), not measured
        runner.batch1(short_prompt, form.batch1_tokens)
        runner.batch1(long_prompt, 2)
    for _ in range(form.repeats):
        for side, runner in (("mohawk", mohawk), ("llama.cpp", llama)):
            add(side, "batch1_tok_s", runner.batch1(short_prompt, form.batch1_tokens)[1])
            add(side, "ttft_512_s", runner.batch1(long_prompt, 2)[0])
    del llama
    batch = LlamaCppBatch(path, threads, num_seqs=32)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(8, 41))] for _ in range(32)]
    mohawk.concurrent(prompts, 64)  # the warm-up (module docstring), not measured
    batch.concurrent(prompts, 64)
    for _ in range(form.concurrent_repeats):
        add("mohawk", "concurrent_32_tok_s", mohawk.concurrent(prompts, 64))
        add("llama.cpp", "concurrent_32_tok_s", batch.concurrent(prompts, 64))
    batch.close()
    stats = {side: {key: stat(values) for key, values in by_key.items()} for side, by_key in runs.items()}
    ratios = {
        key: stats["mohawk"][key]["median"] / stats["llama.cpp"][key]["median"] for key in runs["mohawk"]
    }
    return {"runs": runs, "stats": stats, "ratios": ratios}


ROWS = [
    ("batch1_tok_s", "batch-1 decode, tok/s"),
    ("concurrent_32_tok_s", "32 concurrent streams, tok/s"),
    ("ttft_512_s", "first token of a 512-token prompt, s"),
    ("load_s", "process start to first token, s"),
    ("rss_gb", "peak RSS, GB"),
]


def table(name: str, figures: dict[str, Any]) -> list[str]:
    def cell(side: str, key: str) -> str:
        s = figures["stats"][side][key]
        return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"

    lines = [f"**{name}**", "", "| | Mohawk | llama.cpp | Mohawk / llama.cpp |", "|---|---|---|---|"]
    for key, label in ROWS:
        lines.append(
            f"| {label} | {cell('mohawk', key)} | {cell('llama.cpp', key)} | {figures['ratios'][key]:.2f}× |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every file (make bench)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--files", help="comma-separated SHAPE:TYPE (real_shapes.py's), instead of a form's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    form = FULL if args.full else SHORT
    results: dict[str, Any] = {}
    lines = [
        f"real files ({'full' if args.full else 'short'} form, {args.threads} threads a side, {form})",
        "",
    ]
    files = FULL_FILES if args.full else SHORT_FILES
    if args.files:
        files = [
            (shape, type_name) for shape, _, type_name in (f.partition(":") for f in args.files.split(","))
        ]
    for shape, type_name in files:
        path = model_file(shape, type_name)
        results[path.name] = measure_file(path, form, args.threads)
        lines += table(path.name, results[path.name])
        print("\n".join(table(path.name, results[path.name])), flush=True)
    if args.json:
        write_results(args.json, {"form": form.__dict__, "threads": args.threads, "files": results}, lines)


if __name__ == "__main__":
    main()
