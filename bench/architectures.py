"""Architectures side by side with llama.cpp: for each architecture, one Q4_K_M file made by
llama.cpp's own quantizer, and on that same file Mohawk's engine against llama-cpp-python.

Design. A random-weight model of each architecture (tests/common/model_store/arch_gguf.py: the bundled
SmolLM2 tokenizer and chat template, hidden 512, matrices widened by --scale so logits spread) is
written as an F16 GGUF, and `llama_model_quantize` turns it into Q4_K_M, so the quantized codes are
llama.cpp's and not ours. Then, on that file, in one run:
  * teacher-forced greedy agreement: one fixed token sequence (the chat template around a fixed
    text, >= 64 positions) goes through llama.cpp with logits at every position, and through Mohawk's
    engine as one request per prefix, one greedy token each: the share of positions where the two
    argmaxes agree, on the F16 file (Mohawk fp32: the same float weights on both sides, so only the
    model code differs) and on the Q4_K_M file (Mohawk native, the default, and fp32), with
    llama.cpp's own top-1 minus top-2 logit gap at each disagreement. llama.cpp rounds activations
    to 8 bits before every quantized matmul (Q8_K/Q8_0 dot products) and Mohawk does not, which
    moves logits by about as much as the weights' own quantization does; a random model's logits over
    49k tokens are near-Gaussian, top-2 gaps a fraction of their spread, so near-ties flip;
  * batch-1 decode tokens/s and 32-stream aggregate tokens/s (prefill included), Mohawk native
    against llama-cpp-python (bench/llama_cpp_batch.py runs its 32 sequences in one context), the
    same --threads on both, interleaved, median and min–max of --repeats runs;
  * the bytes Mohawk's stage holds against the GGUF's bytes for the same tensors.
usage: python bench/architectures.py [--arch A]... [--json OUT] [--markdown OUT]   (bench extra needed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (the GGUF writer)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # runners.py, engine.py

import numpy as np
import torch
from engine import Stat, machine
from llama_cpp_batch import LlamaCppBatch
from real_shapes import FILE_TYPES, quantize
from results_file import write_results
from runners import LLAMA_CPP_MISSING, LlamaCppRunner, MohawkRunner, llama_cpp_version

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from tests.common.model_store.arch_gguf import ARCHITECTURES, Shape, write_arch_gguf

SHAPE = Shape(hidden=512, intermediate=1536, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64)
MATRICES = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate")
F16 = dict.fromkeys((*MATRICES, "ffn_up", "ffn_down", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), "F16")
TEXT = (
    "The river wound through the valley, past mills and orchards, until it reached the sea. "
    "Fishermen mended their nets on the shore while gulls circled above the harbour, and the "
    "old lighthouse keeper counted the ships that came home before the storm."
)


@dataclass(frozen=True)
class Form:
    repeats: int
    batch1_tokens: int
    concurrent_tokens: int
    num_streams: int = 32


FULL = Form(repeats=3, batch1_tokens=32, concurrent_tokens=16)
SHORT = Form(repeats=1, batch1_tokens=8, concurrent_tokens=4, num_streams=8)
FIRST = 8  # the first position compared: the argmax after sequence[:8]


def quantize_q4_k_m(source: Path, target: Path, num_threads: int) -> None:
    """llama.cpp's own quantizer: `source` (F16/F32 GGUF) to `target` as Q4_K_M."""
    quantize(source, target, FILE_TYPES["Q4_K_M"], num_threads)


def argmax_and_gap(logits: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    top2 = np.sort(np.partition(logits, -2, axis=-1)[:, -2:], axis=-1)
    return logits.argmax(axis=-1), top2[:, 1] - top2[:, 0]


def mohawk_greedy(runner: MohawkRunner, sequence: list[int], first: int) -> list[int]:
    """Mohawk's greedy next token after each prefix `sequence[:i]`, i from `first` to the end."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    prompts = [sequence[:i] for i in range(first, len(sequence))]
    return [c.token_ids[0] for c in runner.engine.generate(prompts, params)]


def agreement(
    runners: dict[str, MohawkRunner], llama: LlamaCppBatch, sequence: list[int], first: int
) -> dict[str, Any]:
    theirs, gaps = argmax_and_gap(llama.all_logits(sequence)[first - 1 : -1])
    figures: dict[str, Any] = {
        "positions": len(theirs),
        "llama_cpp_gap": {"median": float(np.median(gaps)), "min": float(gaps.min())},
        # a model whose greedy token is its input token has learnt nothing to disagree on
        "echo_share": float(np.mean(theirs == np.array(sequence[first - 1 : -1]))),
    }
    for name, runner in runners.items():
        ours = np.array(mohawk_greedy(runner, sequence, first))
        differ = ours != theirs
        figures[name] = {
            "agree": float(1.0 - differ.mean()),
            "disagree_gaps": sorted(round(float(g), 4) for g in gaps[differ]),
        }
    return figures


class LlamaCppSide:
    """llama-cpp-python: batch 1 through `LlamaCppRunner` (bench/engine.py's), 32 streams through
    `LlamaCppBatch`."""

    name = "llama.cpp"

    def __init__(self, path: Path, num_threads: int, batch: LlamaCppBatch) -> None:
        self.single = LlamaCppRunner(path, num_threads)
        self.batch1 = self.single.batch1
        self.concurrent = batch.concurrent


def speed(sides: Sequence[Any], form: Form, prompts: list[list[int]]) -> dict[str, dict[str, Stat]]:
    results: dict[str, dict[str, list[float]]] = {s.name: {"decode": [], "aggregate": []} for s in sides}
    for side in sides:  # warm-up
        side.batch1(prompts[0], 4)
        side.concurrent(prompts, 2)
    for _ in range(form.repeats):
        for side in sides:  # interleaved, so drift in machine load hits both alike
            results[side.name]["decode"].append(side.batch1(prompts[0], form.batch1_tokens)[1])
            results[side.name]["aggregate"].append(side.concurrent(prompts, form.concurrent_tokens))
    return {name: {k: Stat.of(v) for k, v in metrics.items()} for name, metrics in results.items()}


def bench_arch(arch: str, directory: Path, form: Form, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    f16, q4 = directory / f"{arch}-f16.gguf", directory / f"{arch}-q4_k_m.gguf"
    write_arch_gguf(f16, arch, SHAPE, F16, scale=args.scale)
    quantize_q4_k_m(f16, q4, args.threads)
    figures: dict[str, Any] = {"gguf_bytes": q4.stat().st_size}
    # the F16 file first: both sides run the same float weights, so this isolates the model code
    float_source = open_model(f16)
    sequence = chat_sequence(float_source)
    figures["sequence_tokens"] = len(sequence)
    float_side = LlamaCppBatch(f16, args.threads, num_seqs=1)
    float_runner = MohawkRunner(EngineSettings(model=str(f16), weights="fp32"), float_source)
    figures["f16_agreement"] = agreement({"fp32": float_runner}, float_side, sequence, FIRST)
    float_side.close()
    del float_runner
    f16.unlink()
    source = open_model(q4)
    runners = {
        weights: MohawkRunner(EngineSettings(model=str(q4), weights=weights), source)
        for weights in ("native", "fp32")
    }
    llama = LlamaCppBatch(q4, args.threads, num_seqs=form.num_streams)
    figures["agreement"] = agreement(runners, llama, sequence, FIRST)
    prompts = [sequence[: 16 + (i * 7) % 48] for i in range(form.num_streams)]
    sides = [runners["native"], LlamaCppSide(q4, args.threads, llama)]
    stats = speed(sides, form, prompts)
    figures["speed"] = {name: {k: vars(v) for k, v in m.items()} for name, m in stats.items()}
    memory = runners["native"].memory
    held, stored = sum(m.held_bytes for m in memory), sum(m.gguf_bytes or 0 for m in memory)
    figures["memory"] = {"held_bytes": held, "gguf_tensor_bytes": stored, "ratio": held / stored}
    figures["stored_formats"] = stored_formats(source)
    if args.profile:
        figures["profile"] = profile_batch1(runners["native"], prompts[0])
    figures["seconds"] = round(time.perf_counter() - start, 1)
    llama.close()
    return figures


def profile_batch1(runner: MohawkRunner, prompt: list[int], num_tokens: int = 16) -> list[dict[str, Any]]:
    """torch's profiler over one batch-1 run: the ops with the most self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.batch1(prompt, num_tokens)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    top = [
        {"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in events[:6]
    ]
    print(f"profile, batch 1, {num_tokens} tokens: {top}", flush=True)
    return top


def chat_sequence(source: ModelSource) -> list[int]:
    """The fixed sequence: the file's chat template around TEXT, and TEXT again as the reply."""
    tokenizer = source.load_tokenizer()
    prompt = encode_chat(tokenizer, [{"role": "user", "content": TEXT}])
    return list(prompt) + list(tokenizer.encode(TEXT, add_special_tokens=False))


def stored_formats(source: ModelSource) -> dict[str, int]:
    from mohawk_common.model_store.gguf_source import GGUFSource

    counts: dict[str, int] = {}
    if isinstance(source, GGUFSource):
        for info in source._file.tensors.values():
            counts[info.tensor_type.name] = counts.get(info.tensor_type.name, 0) + 1
    return counts


def markdown(results: dict[str, Any]) -> list[str]:
    lines = [
        "| Architecture | Q4_K_M file | held ÷ GGUF | argmax = llama.cpp's: F16 file (fp32) "
        "| Q4_K_M file: native / fp32 | llama.cpp top-2 gap on Q4_K_M: median (min) "
        "| batch-1 decode tok/s: Mohawk / llama.cpp | 32 streams tok/s: Mohawk / llama.cpp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arch, fig in results.items():
        agree, gap = fig["agreement"], fig["agreement"]["llama_cpp_gap"]
        speed = {name: {k: Stat(**v) for k, v in m.items()} for name, m in fig["speed"].items()}
        ours, theirs = speed["mohawk-native"], speed["llama.cpp"]
        lines.append(
            f"| {arch} | {fig['gguf_bytes'] / 2**20:.1f} MiB | {fig['memory']['ratio']:.3f}x "
            f"| {fig['f16_agreement']['fp32']['agree']:.1%} "
            f"| {agree['native']['agree']:.1%} / {agree['fp32']['agree']:.1%} of {agree['positions']} "
            f"| {gap['median']:.3f} ({gap['min']:.4f}) "
            f"| {ours['decode']} / {theirs['decode']} | {ours['aggregate']} / {theirs['aggregate']} |"
        )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--arch", action="append", choices=sorted(ARCHITECTURES), help="default: all")
    parser.add_argument("--short", action="store_true", help="one run of each speed figure, 8 streams")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads, both sides (default 2)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="random init multiplier (default 1: transformers' own init)"
    )
    parser.add_argument("--profile", action="store_true", help="torch's profiler over a Mohawk batch-1 run")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print(f"bench/architectures.py: {LLAMA_CPP_MISSING}", file=sys.stderr)
        return 2
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    form = SHORT if args.short else FULL
    load_before = os.getloadavg()  # other work on the machine skews the speed figures: say how much
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mohawk-arch-bench-") as directory:
        for arch in args.arch or ARCHITECTURES:
            results[arch] = bench_arch(arch, Path(directory), form, args)
            print(
                f"{arch}: {json.dumps(results[arch]['agreement'])} ({results[arch]['seconds']} s)", flush=True
            )
    table = markdown(results)
    print("\n".join(table))
    print(f"load average {load_before} before, {os.getloadavg()} after")
    command = "python bench/architectures.py " + " ".join(argv if argv is not None else sys.argv[1:])
    figures = {
        "command": command.strip(),
        "machine": machine(),
        "llama_cpp": llama_cpp_version(),
        "threads": args.threads,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "form": vars(form),
        "shape": vars(SHAPE),
        "scale": args.scale,
        "architectures": results,
    }
    if args.json:
        write_results(args.json, figures, table, argv)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
