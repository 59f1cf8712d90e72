"""Engine benchmark: Mohawk's engine against transformers and llama.cpp, same model, same prompts, one run.

Measures, on the bundled SmolLM2-135M Q4_1 GGUF (or --model), on CPU unless --device says otherwise,
with the same --threads on every side:
  * batch-1: time to first token and decode tokens/s of one request, for each Mohawk weight format
    in --weights (native, int4, bf16, fp32), transformers (fp32 unless --dtype) and llama.cpp
    (llama-cpp-python, an optional extra: `pip install 'mohawk[bench]'`; skipped when missing);
  * 32 concurrent requests of mixed prompt lengths: aggregate output tokens/s of each Mohawk format,
    against transformers' static batched `generate()` of the same 32 prompts (left-padded);
  * memory: each Mohawk format's weight bytes per stage against the GGUF file's bytes for the same
    tensors, and the process RSS after each load.
Runs are interleaved (each repeat runs every side once), so drift in machine load hits all alike.
Every figure is the median of the form's runs with its min–max; the ratios of medians are what we
report. The short form's test floors use the ratios of each side's best run instead (as timeit
advises: the best run is the one least disturbed by whatever else a shared CI machine is doing).
`python bench/engine.py` runs the short form (CI, `make test`); `--full` the full form (`make bench`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from results_file import write_results
from runners import (
    LLAMA_CPP_MISSING,
    LlamaCppRunner,
    MohawkRunner,
    TransformersRunner,
    llama_cpp_version,
    timed,
)

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.config import EngineSettings, WeightsMode

__all__ = ["TOPICS", "Stat", "timed"]

TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "owls", "jazz", "glaciers"]
LLAMA_CPP = "llama.cpp"
TRANSFORMERS = "transformers"


@dataclass(frozen=True)
class Form:
    repeats: int  # batch-1 runs of each side
    batch1_tokens: int
    concurrent_repeats: int
    concurrent_tokens: int
    num_concurrent: int = 32
    warmup_prompts: int = 32  # of the concurrent warm-up (first calls pay allocation, kernel choice)


# Short: batch-1 is cheap, so it gets the runs; transformers' padded 32-prompt batch costs ~40 s a
# run here, and its ratio (~5x) sits far above its 1.5x floor, so one run of it is enough. Its
# warm-up takes 4 prompts: the 32-prompt one cost transformers 24 s of that, for 2 tokens.
SHORT = Form(repeats=5, batch1_tokens=48, concurrent_repeats=1, concurrent_tokens=16, warmup_prompts=4)
FULL = Form(repeats=5, batch1_tokens=128, concurrent_repeats=5, concurrent_tokens=64)


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        return cls(statistics.median(values), min(values), max(values))

    def __format__(self, spec: str) -> str:
        """`f"{stat:.2f}"`: each figure in that format; the default is `.1f`."""
        spec = spec or ".1f"
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"

    def __str__(self) -> str:
        return format(self)


Stats = dict[str, dict[str, Stat]]  # runner name -> metric -> Stat


def chat_prompts(source: ModelSource, count: int) -> list[list[int]]:
    """`count` chat prompts of mixed lengths (36 to 378 tokens with the bundled tokenizer)."""
    tokenizer = source.load_tokenizer()
    prompts = []
    for i in range(count):
        detail = " Explain every step and give examples." * (i % 8) ** 2
        question = f"Tell me about {TOPICS[i % len(TOPICS)]}.{detail}"
        prompts.append(encode_chat(tokenizer, [{"role": "user", "content": question}]))
    return prompts


def measure(runners: Sequence[Any], form: Form, source: ModelSource) -> Stats:
    prompts = chat_prompts(source, form.num_concurrent)
    single = prompts[0]
    results: dict[str, dict[str, list[float]]] = {r.name: {"ttft_ms": [], "decode": []} for r in runners}
    for runner in runners:  # warm-up: first calls pay one-off allocation and kernel selection
        runner.batch1(single, 4)
        if runner.supports_concurrent:
            runner.concurrent(prompts[: form.warmup_prompts], 2)
            results[runner.name]["aggregate"] = []
    for repeat in range(max(form.repeats, form.concurrent_repeats)):
        for runner in runners:  # interleaved, so drift in machine load hits every side alike
            if repeat < form.repeats:
                ttft, decode = runner.batch1(single, form.batch1_tokens)
                results[runner.name]["ttft_ms"].append(ttft * 1000)
                results[runner.name]["decode"].append(decode)
            if runner.supports_concurrent and repeat < form.concurrent_repeats:
                aggregate = runner.concurrent(prompts, form.concurrent_tokens)
                results[runner.name]["aggregate"].append(aggregate)
    return {name: {k: Stat.of(v) for k, v in metrics.items()} for name, metrics in results.items()}


def ratios(stats: Stats, ours: str, peer: str, *, best: bool = False) -> dict[str, float]:
    """`ours` ÷ `peer`, of the medians or (`best`) of each side's best run, on the metrics both have."""
    mine, theirs = stats[ours], stats[peer]

    def pick(stat: Stat, fastest: bool) -> float:
        return (stat.high if fastest else stat.low) if best else stat.median

    result: dict[str, float] = {
        key: pick(mine[key], True) / pick(theirs[key], True)
        for key in ("decode", "aggregate")
        if key in mine and key in theirs
    }
    result["ttft_speedup"] = pick(theirs["ttft_ms"], False) / pick(mine["ttft_ms"], False)
    return result


def all_ratios(stats: Stats, mohawk_names: Sequence[str], *, best: bool = False) -> dict[str, Any]:
    """Per Mohawk runner: its ratios to transformers and (when measured) to llama.cpp."""
    peers = [p for p in (TRANSFORMERS, LLAMA_CPP) if p in stats]
    return {name: {peer: ratios(stats, name, peer, best=best) for peer in peers} for name in mohawk_names}


def speed_table(stats: Stats, form: Form) -> list[str]:
    names = list(stats)
    rows = [
        ("batch-1 decode, tokens/s", "decode"),
        ("batch-1 time to first token, ms", "ttft_ms"),
        (f"{form.num_concurrent} concurrent, aggregate tokens/s", "aggregate"),
    ]
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key in rows:
        cells = [str(stats[n][key]) if key in stats[n] else "—" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def ratio_table(table: dict[str, Any]) -> list[str]:
    lines = ["| Mohawk ÷ | decode | time to first token | concurrent aggregate |", "|---|---|---|---|"]
    for name, peers in table.items():
        for peer, r in peers.items():
            aggregate = f"{r['aggregate']:.2f}×" if "aggregate" in r else "—"
            lines.append(
                f"| {name} ÷ {peer} | {r['decode']:.2f}× | {r['ttft_speedup']:.2f}× faster | {aggregate} |"
            )
    return lines


def memory_table(mohawk: Sequence[MohawkRunner], llama: LlamaCppRunner | None) -> list[str]:
    lines = [
        "| runner | stage | weights held, MiB | GGUF tensors, MiB | held ÷ GGUF | RSS after (+load), MiB |",
        "|---|---|---|---|---|---|",
    ]
    for runner in mohawk:
        rss = f"{runner.rss_after_load / 2**20:.0f} (+{runner.rss_delta / 2**20:.0f})"
        for stage in runner.memory:
            gguf = "—" if stage.gguf_bytes is None else f"{stage.gguf_bytes / 2**20:.1f}"
            ratio = "—" if stage.ratio is None else f"{stage.ratio:.2f}×"
            held = f"{stage.held_bytes / 2**20:.1f}"
            lines.append(f"| {runner.name} | {stage.layers} | {held} | {gguf} | {ratio} | {rss} |")
    if llama is not None:
        rss = f"{llama.rss_after_load / 2**20:.0f} (+{llama.rss_delta / 2**20:.0f})"
        lines.append(f"| {LLAMA_CPP} | all (mmap) | — | — | — | {rss} |")
    return lines


def memory_figures(mohawk: Sequence[MohawkRunner], llama: LlamaCppRunner | None) -> dict[str, Any]:
    figures: dict[str, Any] = {
        r.name: {
            "stages": [{**asdict(s), "ratio": s.ratio} for s in r.memory],
            "rss_after_load": r.rss_after_load,
            "rss_delta": r.rss_delta,
        }
        for r in mohawk
    }
    if llama is not None:
        figures[LLAMA_CPP] = {"rss_after_load": llama.rss_after_load, "rss_delta": llama.rss_delta}
    return figures


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "llama_cpp": llama_cpp_version(),
    }


def parse_weights(text: str) -> list[WeightsMode]:
    formats = [w.strip() for w in text.split(",") if w.strip()]
    allowed = get_args(WeightsMode)
    unknown = [w for w in formats if w not in allowed]
    if not formats or unknown:
        raise argparse.ArgumentTypeError(f"weights must be a comma list of {', '.join(allowed)}")
    return formats  # type: ignore[return-value]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--model", help="GGUF file or safetensors directory (default: bundled)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="compute dtype of Mohawk and transformers")
    parser.add_argument(
        "--weights",
        type=parse_weights,
        default=["native"],
        help="Mohawk weight formats, comma-separated, each its own runner (e.g. native,fp32)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads, every side")
    parser.add_argument("--no-llama-cpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="turn Mohawk's prefix cache off: every run recomputes its prompts, as transformers does",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def build_llama_cpp(args: argparse.Namespace, source: ModelSource) -> tuple[LlamaCppRunner | None, str]:
    """The llama.cpp runner, or None and why not."""
    if args.no_llama_cpp:
        return None, "llama.cpp left out (--no-llama-cpp)"
    if llama_cpp_version() is None:
        return None, LLAMA_CPP_MISSING
    if source.path.suffix != ".gguf":
        return None, f"llama.cpp needs a GGUF file, not {source.path}"
    return LlamaCppRunner(source.path, args.threads), f"llama-cpp-python {llama_cpp_version()}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("warning")
    form = FULL if args.full else SHORT
    torch.set_num_threads(args.threads)
    source = open_model(args.model)
    common: dict[str, Any] = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "num_threads": args.threads,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": not args.no_prefix_cache,
    }
    mohawk = [MohawkRunner(EngineSettings(**common, weights=w), source) for w in args.weights]
    llama, llama_note = build_llama_cpp(args, source)
    backend = mohawk[0].engine.stages[0].backend
    device, dtype = torch.device(backend.device), backend.dtype
    transformers = TransformersRunner(source, device, dtype)
    runners: list[Any] = [*mohawk, *([llama] if llama else []), transformers]
    stats = measure(runners, form, source)
    names = [r.name for r in mohawk]
    header = (
        f"engine benchmark ({'full' if args.full else 'short'} form: {form.repeats} batch-1 runs of "
        f"{form.batch1_tokens} tokens, {form.concurrent_repeats} of {form.num_concurrent}×"
        f"{form.concurrent_tokens} tokens concurrent, interleaved) — {source.config.model_id}, "
        f"{device} {str(dtype).removeprefix('torch.')}, weights {','.join(args.weights)}, "
        f"prefix cache {'off' if args.no_prefix_cache else 'on'}, {args.threads} threads every side, "
        f"torch {torch.__version__}, {llama_note}, {platform.machine()}"
    )
    result: dict[str, Any] = {
        "machine": machine(),
        "form": asdict(form),
        "threads": args.threads,
        "llama_cpp": llama_note,
        "ratios": all_ratios(stats, names),
        "best_ratios": all_ratios(stats, names, best=True),
        "stats": {n: {k: asdict(v) for k, v in m.items()} for n, m in stats.items()},
        "memory": memory_figures(mohawk, llama),
    }
    lines = [header, "", *speed_table(stats, form), "", "median (min–max) of each side's runs", ""]
    lines += [*ratio_table(result["ratios"]), "", "ratios of medians", ""]
    lines += [*memory_table(mohawk, llama), ""]
    lines.append("RSS includes each Mohawk engine's KV cache (its budget: 1 GiB on CPU by default)")
    if not args.no_prefix_cache:
        lines.append(
            "Mohawk's prefix cache is on: its batch-1 runs after the first reuse the cached prompt, "
            "llama.cpp (reset each run) and transformers recompute it; --no-prefix-cache to compare"
        )
    if llama is None:
        lines.append(llama_note)
    print("\n".join(lines))
    print(json.dumps({"ratios": result["ratios"], "best_ratios": result["best_ratios"]}))
    if args.json:
        write_results(args.json, result, lines, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
