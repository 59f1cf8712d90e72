"""Does a sequence's greedy text depend on what else runs? Four checks, in one process.

Six chat prompts of different lengths, greedy, each run:
  * alone (the reference);
  * among 26 other prompts of mixed lengths, all 32 admitted together;
  * alone with another chunked-prefill budget (`max_num_batched_tokens` 48 instead of 512), so the
    prompt is cut into different chunks;
  * resumed: the request queued again with the first half of its reference tokens as already
    emitted (`output_token_ids`), as a new stage 0 resumes it after a failover: prompt and those
    tokens re-prefilled, then decoded on; its new tokens must be the rest of the reference.
and for each check prints how many of the six came out token for token the same. Also, per
component, whether a row's result depends on how many rows share its call (`--ops`).

    python bench/batch_invariance.py                 # the default settings (native weights)
    python bench/batch_invariance.py --weights fp32  # for comparison
    python bench/batch_invariance.py --throughput 3  # also the cost: 32 streams and batch-1, on vs off
    python bench/batch_invariance.py --model FILE --kv-blocks 900   # a real_shapes.py 1.7B file
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from results_file import write_results

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import open_model
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine

TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "owls", "jazz", "glaciers"]


def prompts(tokenizer: Any, count: int, offset: int = 0) -> list[list[int]]:
    out = []
    for i in range(offset, offset + count):
        detail = " Explain every step and give examples." * (i % 7) ** 2
        text = f"Tell me {'a fact' if i % 2 else 'a story'} about {TOPICS[i % len(TOPICS)]}.{detail}"
        out.append(encode_chat(tokenizer, [{"role": "user", "content": text}]))
    return out


def run(settings: dict[str, Any], batch: list[list[int]], tokens: int) -> list[list[int]]:
    engine = build_local_engine(EngineSettings(**settings))
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [c.token_ids for c in engine.generate(batch, params)]


def resume(settings: dict[str, Any], prompt: list[int], emitted: list[int], tokens: int) -> list[int]:
    """The tokens after `emitted` of a request resumed with them, as stage 0 resumes one."""
    engine = build_local_engine(EngineSettings(**settings))
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    seq = engine.core.add_request("resumed", prompt, params, output_token_ids=emitted)
    engine.emitter.track(seq.seq_id, "resumed", params, seq.num_prompt_tokens, engine.core.prompt_tail(seq))
    return [event.token_id for event in engine.run() if event.token_id is not None][:tokens]


def checks(settings: dict[str, Any], tokens: int) -> dict[str, Any]:
    source = open_model(settings.get("model"))
    tokenizer = source.load_tokenizer()
    six, others = prompts(tokenizer, 6), prompts(tokenizer, 26, offset=6)
    alone = [run(settings, [p], tokens)[0] for p in six]
    mixed = run(settings, six + others, tokens)[:6]
    chunked = [run({**settings, "max_num_batched_tokens": 48}, [p], tokens)[0] for p in six]
    cut = tokens // 2
    resumed = [resume(settings, p, ref[:cut], tokens - cut) for p, ref in zip(six, alone, strict=True)]

    def same(got: list[list[int]], expected: list[list[int]]) -> int:
        return sum(a == b for a, b in zip(got, expected, strict=True))

    return {
        "prompt_lengths": [len(p) for p in six],
        "in a batch of 32": same(mixed, alone),
        "another chunk size (48)": same(chunked, alone),
        "resumed at half": same(resumed, [ref[cut:] for ref in alone]),
    }


def row_dependence(rows: int = 200) -> dict[str, float]:
    """Largest difference of row 0's result computed alone and among `rows` rows, per kernel."""
    from mohawk_shard.model.quantized_layers import KERNEL_DTYPE, pack_int4

    torch.manual_seed(0)
    n, k, group = 1536, 576, 32
    packed = pack_int4(torch.randint(0, 16, (n, k), dtype=torch.int32), torch.device("cpu"))
    scales = torch.randn(k // group, n, 2).to(KERNEL_DTYPE)
    x = torch.randn(rows, k)
    weight = torch.randn(n, k)
    weight_bf16 = weight.to(KERNEL_DTYPE)
    kernels = {
        "int4 tinygemm (bf16)": lambda a: torch.ops.aten._weight_int4pack_mm_for_cpu(
            a.to(KERNEL_DTYPE), packed, group, scales
        ).float(),
        "dense bf16 matmul": lambda a: torch.nn.functional.linear(a.to(KERNEL_DTYPE), weight_bf16).float(),
        "dense fp32 matmul": lambda a: torch.nn.functional.linear(a, weight),
    }
    return {name: (fn(x)[0] - fn(x[:1])[0]).abs().max().item() for name, fn in kernels.items()}


def throughput(settings: dict[str, Any], runs: int, tokens: int = 16) -> dict[str, Any]:
    """The cost of invariance, with `batch_invariant` on and off interleaved, median (min-max) of
    `runs`: 32 concurrent chat prompts (36 to 378 tokens) × `tokens` greedy tokens, aggregate
    tokens/s; and one request alone, 128 tokens after a 36-token prompt (its prefill included),
    tokens/s."""
    source = open_model(settings.get("model"))
    batch = prompts(source.load_tokenizer(), 32)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    single = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    base = {**settings, "enable_prefix_caching": False}
    engines = {}
    for on in (1, 0):
        engines[on] = build_local_engine(EngineSettings(**base, batch_invariant=bool(on)), source=source)
    for engine in engines.values():
        engine.generate(batch[:4], params)
    rates: dict[int, list[float]] = {1: [], 0: []}
    decode: dict[int, list[float]] = {1: [], 0: []}
    for _ in range(runs):
        for on, engine in engines.items():
            started = time.perf_counter()
            engine.generate(batch, params)
            rates[on].append(len(batch) * tokens / (time.perf_counter() - started))
            started = time.perf_counter()
            engine.generate([batch[0]], single)
            decode[on].append(128 / (time.perf_counter() - started))
    figures: dict[str, Any] = {}
    for name, table in (("32 streams", rates), ("batch-1", decode)):
        for on, v in table.items():
            figures[f"{name}, batch_invariant={bool(on)}"] = (
                f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) tokens/s"
            )
        figures[f"{name}, invariant / not"] = round(
            statistics.median(table[1]) / statistics.median(table[0]), 3
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the bundled model)")
    parser.add_argument("--weights", default=None, help="weight format (default: the engine's default)")
    parser.add_argument("--kv-blocks", type=int, default=2048, help="KV blocks of 16 tokens (a 1.7B: 900)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ops", action="store_true", help="also each matmul kernel's row dependence")
    parser.add_argument("--throughput", type=int, default=0, help="runs of the 32-stream cost check")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings: dict[str, Any] = {"num_threads": args.threads, "num_kv_blocks": args.kv_blocks}
    if args.model:
        settings["model"] = args.model
    if args.weights:
        settings["weights"] = args.weights
    started = time.perf_counter()
    figures: dict[str, Any] = {"settings": settings, "tokens": args.tokens, **checks(settings, args.tokens)}
    if args.throughput:
        figures["cost"] = throughput(settings, args.throughput)
    if args.ops:
        figures["row 0 alone vs among 200 rows, max |difference|"] = row_dependence()
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures, indent=2))
    if args.json:
        write_results(args.json, figures)


if __name__ == "__main__":
    main()
