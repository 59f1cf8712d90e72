"""Batch-1 decode speed of one whole-model MLX stage per weight format (fp32, native, int4).

Builds the stage, prefills one prompt, then times `--steps` single-token decode steps (forward
through every layer and the LM head, greedy next token; no engine, no sampling code) and prints
each format's median step time, spread (min–max and interquartile range), tokens/s and weight
bytes. Formats run one after another in one process, each once per `--rounds` round, interleaved.
usage: python bench/mlx_quant.py [--model PATH] [--formats fp32,native] [--steps N] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from mohawk_common.model_store import open_model
from mohawk_shard.backends.mlx_backend import MlxBackend
from mohawk_shard.model.forward_batch import ForwardBatch

BLOCK_SIZE = 16
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_times(backend: MlxBackend, prompt: list[int], steps: int) -> list[float]:
    """Seconds per decode step after prefilling `prompt`, greedy."""
    num_blocks = -(-(len(prompt) + steps) // BLOCK_SIZE)
    backend.allocate_kv_cache(num_blocks, BLOCK_SIZE)
    table = list(range(num_blocks))
    logits = backend.forward(ForwardBatch.build([(prompt, 0, table, True)], BLOCK_SIZE), None)
    times = []
    for step in range(steps):
        token = int(mx.argmax(logits[-1]))
        batch = ForwardBatch.build([([token], len(prompt) + step, table, True)], BLOCK_SIZE)
        began = time.perf_counter()
        logits = backend.forward(batch, None)
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--formats", default="fp32,native,int4")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    mx.set_default_device(mx.cpu)
    source = open_model(args.model)
    prompt = source.load_tokenizer()(PROMPT)["input_ids"]
    last = source.config.num_layers
    backends = {f: MlxBackend(source, 0, last, device="cpu", weights=f) for f in args.formats.split(",")}
    times: dict[str, list[float]] = {f: [] for f in backends}
    for _ in range(args.rounds):
        for name, backend in backends.items():
            times[name] += decode_times(backend, prompt, args.steps)[2:]  # first steps warm up
    for name, samples in times.items():
        median = statistics.median(samples)
        q1, _, q3 = (q * 1e3 for q in statistics.quantiles(samples, n=4))
        low, high = min(samples) * 1e3, max(samples) * 1e3
        print(
            f"{name:>7}: median {median * 1e3:6.2f} ms/token ({1 / median:5.1f} tok/s), "
            f"IQR {q1:.2f}-{q3:.2f}, min-max {low:.2f}-{high:.2f} ms, "
            f"n={len(samples)}, weights {backends[name].weight_bytes / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
