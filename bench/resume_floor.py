"""The compute floor of a failover's resume: what re-prefilling 16 streams costs, all layers and one
stage's share, against llama.cpp prefilling the same tokens.

After a stage dies, stage 0 re-prefills every stream's prompt and the tokens its client has already
seen, then samples the next token (docs/request-flow.md). No failover can stall its streams less than
that compute takes. This measures it in one process, the model cut in three stages as the chaos
cases cut it, on the chaos streams' prompts (`tests/integration/cluster_helpers.PROMPTS`, chat-
encoded, 16 of them) with `--emitted` tokens each already generated (the chaos kill lands as soon as
every stream has its first text):
  * the whole resume: `generate(histories, max_tokens=1)`, in as few steps as the chunk budget
    allows, as the resume runs, after one warm-up on other tokens of the same shapes (first-call
    costs are out of the floor; the prefix cache holds nothing of the histories, as a new stage 0's
    holds nothing, and shares the blocks the histories have in common, the chat template's system
    prompt, as the resume does);
  * each stage's share of it: the time inside that stage's forward calls. The largest is the floor a
    failover would have if the survivors kept their KV across the re-plan and only the dead stage's
    layers were recomputed (from boundary activations someone kept);
  * the resume with the survivors' KV carried (`engine/kv_carry.py`, as a node hands it to its
    next stage): the middle stage "dies", the first and last stages' KV and rows of every stream
    are carried into a new pipeline over the same weights and a freshly loaded middle, and only
    the middle's layers are computed for the histories (the survivors compute each history's last
    position): the floor of a failover with the survivors' KV kept;
  * the resume with every stage's KV carried, the middle's too (what its standby's holder keeps
    when the middle mirrors its KV there, `engine/kv_mirror.py`): every stage computes each
    history's last position, the floor of a failover onto a standby with mirrored KV;
  * llama.cpp (the `bench` extra) prefilling each history in turn, the same threads: the peer.
Each figure is the median of `--repeats` runs with its min-max. A cluster on one host shares these
cores between its three stages, so its resume takes at least this long.

usage: python bench/resume_floor.py [--files bundled,smollm2-1.7b:Q4_K_M] [--emitted 4]
                                    [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for the chaos prompts

import torch
from real_files import stat
from real_shapes import model_file
from results_file import write_results
from runners import LLAMA_CPP_MISSING, LlamaCppRunner, llama_cpp_version

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.kv_carry import Carry
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.engine.stage import Stage
from mohawk_shard.local import build_local_engine
from tests.integration.cluster_helpers import PROMPTS

NUM_STREAMS = 16
NUM_STAGES = 3
ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def thirds(num_layers: int) -> tuple[int, ...]:
    """Split points that cut `num_layers` in NUM_STAGES ranges as even as they go."""
    return tuple(round(num_layers * i / NUM_STAGES) for i in range(1, NUM_STAGES))


def fresh_engine(source: ModelSource, threads: int) -> LLMEngine:
    settings = EngineSettings(model=str(source.path), device="cpu", num_threads=threads)
    return build_local_engine(settings, thirds(source.config.num_layers), source)


def carrying(engine: LLMEngine) -> LLMEngine:
    """`engine` with stages that keep their rows beside their KV, as a shard node's do."""
    num_blocks = engine.core.scheduler.block_manager.num_blocks
    engine.stages = [Stage(s.backend, s.block_size, num_blocks=num_blocks) for s in engine.stages]
    return engine


def carried_from_survivors(source: ModelSource, streams: list[list[int]], threads: int) -> list[Carry]:
    """Prefill `streams` (their requests left running) and carry every stage's KV and rows, as a
    re-plan's stopped stages hand them on."""
    engine = carrying(fresh_engine(source, threads))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    for index, stream in enumerate(streams):
        engine.add_request(f"stream-{index}", stream, params)
    sampled: set[str] = set()
    while len(sampled) < len(streams):
        sampled |= {event.request_id for event in engine.step()}
    return [stage.export_carry() for stage in engine.stages]


def time_carried_resume(
    source: ModelSource, streams: list[list[int]], carries: list[Carry], threads: int, *, mirrored: bool
) -> tuple[float, list[float]]:
    """The resume of `streams` on a new pipeline whose first and last stages adopt `carries` (the
    middle's KV died with it, or, `mirrored`, its holder kept a copy): seconds in all, and in each
    stage's forward."""
    engine = carrying(fresh_engine(source, threads))
    engine.generate(shifted(streams, source.config.vocab_size), ONE_TOKEN)  # warm-up, same shapes
    adopting = range(len(engine.stages)) if mirrored else (0, len(engine.stages) - 1)
    for survivor in adopting:
        engine.stages[survivor].adopt(copy.copy(carries[survivor]))
    spent = time_forwards(engine)
    start = time.perf_counter()
    for index, stream in enumerate(streams):
        engine.add_request(f"stream-{index}", stream, ONE_TOKEN)
    for _ in engine.run():
        pass
    return time.perf_counter() - start, spent


def shifted(streams: list[list[int]], vocab_size: int) -> list[list[int]]:
    """Token sequences of the same lengths and the same shared prefixes, none of them `streams`'
    (a warm-up through them leaves the prefix cache nothing the measured run could hit)."""
    return [[(t + 1) % vocab_size for t in s] for s in streams]


def time_forwards(engine: LLMEngine) -> list[float]:
    """Per stage, a running total of the seconds spent in its backend's forward from now on."""
    spent = [0.0] * len(engine.stages)
    for index, stage in enumerate(engine.stages):
        forward = stage.backend.forward

        def timed_forward(*args: Any, _forward: Callable[..., Any] = forward, _i: int = index) -> Any:
            start = time.perf_counter()
            try:
                return _forward(*args)
            finally:
                spent[_i] += time.perf_counter() - start

        stage.backend.forward = timed_forward  # type: ignore[method-assign]
    return spent


def histories(source: ModelSource, emitted: int, threads: int) -> list[list[int]]:
    """The 16 streams' prompts with the `emitted` tokens each was sent before the kill (greedy)."""
    tokenizer = source.load_tokenizer()
    prompts = [
        encode_chat(tokenizer, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        for i in range(NUM_STREAMS)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=emitted, ignore_eos=True)
    done = fresh_engine(source, threads).generate(prompts, params)
    return [p + c.token_ids for p, c in zip(prompts, done, strict=True)]


def measure(path: Path | None, emitted: int, repeats: int, threads: int) -> dict[str, Any]:
    source = open_model(str(path) if path else None)
    streams = histories(source, emitted, threads)
    one_token = ONE_TOKEN
    runs: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    for _ in range(repeats):
        engine = fresh_engine(source, threads)
        engine.generate(shifted(streams, source.config.vocab_size), one_token)  # warm-up, same shapes
        spent = time_forwards(engine)
        start = time.perf_counter()
        engine.generate(streams, one_token)
        add("resume, all layers", time.perf_counter() - start)
        for index, seconds in enumerate(spent):
            add(f"stage {index} forward", seconds)
        add("largest stage", max(spent))
        del engine
    carries = carried_from_survivors(source, streams, threads)
    for _ in range(repeats):
        took, spent = time_carried_resume(source, streams, carries, threads, mirrored=False)
        add("resume, survivors' KV kept (middle recomputed)", took)
        for index, seconds in enumerate(spent):
            add(f"stage {index} forward, survivors' KV kept", seconds)
        took, _ = time_carried_resume(source, streams, carries, threads, mirrored=True)
        add("resume, every stage's KV kept (the middle's mirrored)", took)
    if llama_cpp_version() is not None:
        llama = LlamaCppRunner(source.path, threads)
        for _ in range(repeats):
            start = time.perf_counter()
            for history in streams:
                llama.batch1(history, 1)
            add("llama.cpp prefill, one after another", time.perf_counter() - start)
    else:
        print(LLAMA_CPP_MISSING, file=sys.stderr)
    stats = {key: stat(values) for key, values in runs.items()}
    ratios = {}
    if "llama.cpp prefill, one after another" in stats:
        peer = stats["llama.cpp prefill, one after another"]["median"]
        ratios["resume / llama.cpp"] = stats["resume, all layers"]["median"] / peer
        kept = stats["resume, survivors' KV kept (middle recomputed)"]["median"]
        ratios["resume with the survivors' KV kept / llama.cpp"] = kept / peer
        mirrored = stats["resume, every stage's KV kept (the middle's mirrored)"]["median"]
        ratios["resume with every stage's KV kept / llama.cpp"] = mirrored / peer
    return {
        "tokens": sum(len(s) for s in streams),
        "split_points": list(thirds(source.config.num_layers)),
        "runs": runs,
        "stats": stats,
        "ratios": ratios,
    }


def table(name: str, figures: dict[str, Any]) -> list[str]:
    lines = [
        f"**{name}**: {NUM_STREAMS} streams, {figures['tokens']} tokens, cut at {figures['split_points']}",
        "",
        "| | s, median (min–max) |",
        "|---|---|",
    ]
    for key, s in figures["stats"].items():
        lines.append(f"| {key} | {s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}) |")
    lines += [f"| {key} | {value:.2f}× |" for key, value in figures["ratios"].items()]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", default="bundled", help="comma-separated SHAPE:TYPE or `bundled`")
    parser.add_argument("--emitted", type=int, default=4, help="tokens each stream had been sent")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    files = [None if f == "bundled" else model_file(*f.split(":", 1)) for f in args.files.split(",")]
    results: dict[str, Any] = {}
    lines = [f"resume floor ({args.threads} threads, {args.emitted} tokens emitted, {args.repeats} runs)", ""]
    for path in files:
        name = path.name if path else "bundled SmolLM2-135M-Instruct Q4_1"
        results[name] = measure(path, args.emitted, args.repeats, args.threads)
        lines += table(name, results[name])
        print("\n".join(table(name, results[name])), flush=True)
    if args.json:
        form = {"emitted": args.emitted, "repeats": args.repeats, "streams": NUM_STREAMS}
        write_results(args.json, {"form": form, "threads": args.threads, "files": results}, lines)


if __name__ == "__main__":
    main()
