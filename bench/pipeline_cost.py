"""What a pipeline costs on one host: `mohawk up --nodes 2` against the in-process engine and llama.cpp.

One file (the bundled model by default, `--files SHAPE:TYPE` for real_shapes.py's), the same two
threads' worth of cores on every side, runs interleaved in one process:
  * a lone greedy request, decode tokens/s: llama.cpp (llama-cpp-python, in this process), the
    in-process engine, and `mohawk up --nodes 2` end to end through the gateway's streaming
    `/v1/chat/completions` (the same chat prompt, as token ids for the first two);
  * 32 concurrent streams of 64 tokens (mixed prompt lengths), aggregate tokens/s: the in-process
    engine against `mohawk up --nodes 2`.
The cluster's two shard nodes, its gateway, NATS and coordinator share this machine's cores with
the benchmark process (idle while the cluster runs). Every side runs two requests of the measured
length first (the engine has traced its decode steps by then; llama.cpp needs no warm-up, it gets
them all the same). Each figure is the median of the form's runs with its min-max. The targets
(issue 36): the lone request through two nodes >= 0.9x llama.cpp's batch-1 on the bundled file
(>= 0.95x on the 1.7B), 32 streams through two nodes >= 0.8x the in-process engine's.

usage: python bench/pipeline_cost.py [--full] [--files bundled,smollm2-1.7b:Q4_K_M] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from distributed import ClusterSetup, questions
from real_files import stat
from real_shapes import model_file
from results_file import write_results
from runners import LlamaCppRunner, MohawkRunner

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import open_model
from mohawk_shard.config import EngineSettings

NUM_STREAMS = 32
STREAM_TOKENS = 64


@dataclass(frozen=True)
class Form:
    repeats: int
    batch1_tokens: int
    concurrent_repeats: int


SHORT = Form(repeats=3, batch1_tokens=65, concurrent_repeats=2)
FULL = Form(repeats=5, batch1_tokens=129, concurrent_repeats=3)


def measure(path: Path | None, form: Form, threads: int) -> dict[str, Any]:
    """The lone request on three sides and 32 streams on two, for the file at `path` (None: the
    bundled model)."""
    source = open_model(str(path) if path else None)
    tokenizer = source.load_tokenizer()
    qs = questions(NUM_STREAMS)
    lone = encode_chat(tokenizer, [{"role": "user", "content": qs[0]}])
    streams = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in qs]
    settings = EngineSettings(model=str(source.path), device="cpu", num_threads=threads)
    engine, llama = MohawkRunner(settings, source), LlamaCppRunner(source.path, threads)
    cluster = ClusterSetup(2, Path(tempfile.mkdtemp(prefix="mohawk-pipeline-")), model=str(source.path))
    runs: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    try:
        lone_runs = {
            "llama.cpp": lambda: llama.batch1(lone, form.batch1_tokens)[1],
            "in-process": lambda: engine.batch1(lone, form.batch1_tokens)[1],
            "mohawk up --nodes 2": lambda: cluster.batch1(qs[0], form.batch1_tokens).decode_tps,
        }
        for run in lone_runs.values():
            run()  # warm-up: twice, as a bucket is traced after TRACE_AFTER eager steps, which
            run()  # one short answer may not reach in its first bucket
        for _ in range(form.repeats):
            for side, run in lone_runs.items():
                add(f"lone {side}", run())
        for _ in range(form.concurrent_repeats):
            add("32 streams in-process", engine.concurrent(streams, STREAM_TOKENS))
            add("32 streams mohawk up --nodes 2", cluster.concurrent(qs, STREAM_TOKENS))
    finally:
        cluster.close()
    stats = {key: stat(values) for key, values in runs.items()}

    def ratio(key: str, peer: str) -> float:
        return stats[key]["median"] / stats[peer]["median"]

    return {
        "runs": runs,
        "stats": stats,
        "ratios": {
            "lone nodes 2 / llama.cpp": ratio("lone mohawk up --nodes 2", "lone llama.cpp"),
            "lone nodes 2 / in-process": ratio("lone mohawk up --nodes 2", "lone in-process"),
            "lone in-process / llama.cpp": ratio("lone in-process", "lone llama.cpp"),
            "32 streams nodes 2 / in-process": ratio(
                "32 streams mohawk up --nodes 2", "32 streams in-process"
            ),
        },
    }


def table(name: str, figures: dict[str, Any]) -> list[str]:
    lines = [f"**{name}**", "", "| side | tok/s, median (min–max) |", "|---|---|"]
    for key, s in figures["stats"].items():
        lines.append(f"| {key} | {s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f}) |")
    lines += ["", "| ratio | |", "|---|---|"]
    lines += [f"| {key} | {value:.2f}× |" for key, value in figures["ratios"].items()]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="more and longer runs (make bench)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--files", help="comma-separated SHAPE:TYPE (real_shapes.py's) or `bundled` (the default)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    form = FULL if args.full else SHORT
    files: list[Path | None] = [None]
    if args.files:
        files = [None if f == "bundled" else model_file(*f.split(":", 1)) for f in args.files.split(",")]
    results: dict[str, Any] = {}
    lines = [f"pipeline cost ({'full' if args.full else 'short'} form, {args.threads} threads, {form})", ""]
    for path in files:
        name = path.name if path else "bundled SmolLM2-135M-Instruct Q4_1"
        results[name] = measure(path, form, args.threads)
        lines += table(name, results[name])
        print("\n".join(table(name, results[name])), flush=True)
    if args.json:
        write_results(args.json, {"form": form.__dict__, "threads": args.threads, "files": results}, lines)


if __name__ == "__main__":
    main()
