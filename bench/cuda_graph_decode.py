"""Decode on CUDA: Mohawk's engine with its decode steps replayed from CUDA graphs, the same engine
always eager, and transformers' `generate`, interleaved in one run: a lone request, and 32
concurrent streams (transformers: one static batch of them, left-padded).

The model is SmolLM2-135M's shape (30 layers, hidden 576, 9 query and 3 KV heads, vocabulary 49,152)
with random weights in bf16, built here (no download; decode speed does not depend on the values),
or --model. Each Mohawk engine first answers one request of the timed length, which records the
graphs of every context bucket the timed runs reach (`model/traced_decode.py`), and one round of the
streams, which records the batch sizes they run at; the timed runs then measure the steady state a
long-lived server is in. Every figure is the median of --repeats runs
with its min–max; the ratios are of medians.
`python bench/cuda_graph_decode.py [--tokens N] [--repeats N] [--streams N] [--model PATH] [--json FILE]`
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from results_file import write_results
from runners import MohawkRunner, TransformersRunner

from mohawk_common.logging import configure_logging
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.config import EngineSettings

PROMPT = [1, 504, 3458, 282, 260, 3563, 30, 2, 9690, 314, 253, 1345, 28, 1115, 1341, 30]
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


def random_model(directory: Path, shape: dict[str, Any] = SMOLLM2_135M) -> ModelSource:
    """A llama of `shape` with random bf16 weights, and a word-per-id tokenizer of its vocabulary
    (the engine detokenizes what it decodes)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    config = AutoConfig.for_model("llama", **shape)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
    vocab = {f"w{i}": i for i in range(config.vocab_size)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(directory)
    return open_model(directory)


def mohawk(source: ModelSource, graphs: bool) -> MohawkRunner:
    settings = EngineSettings(device="cuda", weights="bf16", enable_prefix_caching=False)
    runner = MohawkRunner(settings, source)
    if not graphs:
        for stage in runner.engine.stages:
            stage.backend.traced_decode = None
    runner.name = "mohawk, CUDA graphs" if graphs else "mohawk, eager"
    return runner


def stream_prompts(count: int) -> list[list[int]]:
    """`count` distinct prompts of 9 to 16 tokens (PROMPT's tail, rotated ids)."""
    return [[(t + 97 * i) % 49152 for t in PROMPT[i % 8 :]] for i in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens each timed request decodes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--streams", type=int, default=32, help="concurrent streams of the second table")
    parser.add_argument("--model", type=Path, help="GGUF or safetensors (default: random, SmolLM2's shape)")
    parser.add_argument("--json", type=Path, help="save the figures as a stamped result file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing to measure")
        return 0
    configure_logging("warning", json=False)
    prompts = stream_prompts(args.streams)
    with tempfile.TemporaryDirectory() as scratch:
        source = open_model(args.model) if args.model else random_model(Path(scratch))
        runners: list[Any] = [mohawk(source, True), mohawk(source, False)]
        runners.append(TransformersRunner(source, torch.device("cuda"), torch.bfloat16))
        for runner in runners:  # warm-up: cuBLAS, the allocator, every (batch, bucket) graph
            runner.batch1(PROMPT, args.tokens)
            runner.concurrent(prompts, args.tokens)
        speeds: dict[str, list[float]] = {r.name: [] for r in runners}
        streams: dict[str, list[float]] = {r.name: [] for r in runners}
        for _ in range(args.repeats):
            for runner in runners:
                speeds[runner.name].append(runner.batch1(PROMPT, args.tokens)[1])
                streams[runner.name].append(runner.concurrent(prompts, args.tokens))
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    stream_medians = {name: statistics.median(v) for name, v in streams.items()}
    device = torch.cuda.get_device_name()
    lines = [f"{device}, bf16, {args.repeats} runs a side, interleaved"]
    for title, figures, middle in (
        (f"batch-1 decode of {args.tokens} tokens", speeds, medians),
        (
            f"{args.streams} concurrent streams of {args.tokens} tokens (transformers: a static batch)",
            streams,
            stream_medians,
        ),
    ):
        graphed, eager, peer = (middle[r.name] for r in runners)
        lines += [
            title,
            "| side | tok/s | min–max |",
            "|---|---|---|",
            *(f"| {n} | {middle[n]:.1f} | {min(v):.1f}–{max(v):.1f} |" for n, v in figures.items()),
            f"CUDA graphs ÷ eager: {graphed / eager:.2f}×; ÷ transformers: {graphed / peer:.2f}×",
        ]
    print("\n".join(lines))
    if args.json:
        figures = {"tokens_per_s": speeds, "medians": medians, "streams_tokens_per_s": streams}
        write_results(args.json, {**figures, "streams_medians": stream_medians}, lines, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
