"""Which form of the hidden states a hop can carry and keep greedy output identical.

The bundled model as two stages in one process (split after layer 15, the default engine and
weights): every prompt decoded greedily with the hidden states handed over as they are (float32,
what the wire carries), then rounded through bfloat16 and float16 at the hand-over, as a
half-precision wire would make them. Prints, per form, how many prompts' tokens differ from the
float32 run and the first token that does. Then what lossless compression would save on the
float32 decode payloads (one row, the hidden states a lone request's hop carries): zlib at its
fastest, zlib after a byte shuffle, lzma; the ratio to the raw bytes and the microseconds it
takes per payload, beside a hop's 0.26-0.29 ms (`bench/hops.py`).

usage: python bench/activation_forms.py [--prompts 8] [--tokens 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import lzma
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from distributed import questions
from results_file import write_results

from mohawk_common.chat import encode_chat
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine import stage as stage_module
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine

SPLIT = 15
ROUNDED = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def greedy(prompts: int, tokens: int, form: str, captured: list[bytes]) -> list[list[int]]:
    """Each prompt's greedy tokens, the hidden states rounded through `form` at the hand-over."""
    original = stage_module.Stage.step

    def step(self: Any, batch: Any, hidden: torch.Tensor | None) -> Any:
        if hidden is not None and form in ROUNDED:
            hidden = hidden.to(ROUNDED[form]).to(hidden.dtype)
        elif hidden is not None and hidden.shape[0] == 1:
            captured.append(hidden.detach().contiguous().numpy().tobytes())
        return original(self, batch, hidden)

    stage_module.Stage.step = step  # type: ignore[method-assign]
    try:
        engine = build_local_engine(EngineSettings(num_threads=torch.get_num_threads()), split_points=[SPLIT])
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        ids = [encode_chat(engine.tokenizer, [{"role": "user", "content": q}]) for q in questions(prompts)]
        return [list(engine.generate([i], params)[0].token_ids) for i in ids]
    finally:
        stage_module.Stage.step = original  # type: ignore[method-assign]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def _shuffled_zlib(data: bytes) -> bytes:
    return zlib.compress(np.frombuffer(data, np.uint8).reshape(-1, 4).T.copy().tobytes(), 1)


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "zlib level 1": lambda data: zlib.compress(data, 1),
    "byte shuffle + zlib level 1": _shuffled_zlib,
    "lzma": lzma.compress,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    captured: list[bytes] = []
    reference = greedy(args.prompts, args.tokens, "float32", captured)
    table = [
        "| hand-over form | prompts whose tokens differ | first differing token, per prompt |",
        "|---|---|---|",
    ]
    figures: dict[str, Any] = {"prompts": args.prompts, "tokens": args.tokens, "forms": {}, "compression": {}}
    table.append(f"| float32 (the wire's) | 0 of {args.prompts} | (the reference) |")
    for form in ROUNDED:
        firsts = [
            first_difference(a, b)
            for a, b in zip(reference, greedy(args.prompts, args.tokens, form, []), strict=True)
        ]
        differing = sum(f is not None for f in firsts)
        figures["forms"][form] = {"differing": differing, "first_difference": firsts}
        shown = ", ".join("-" if f is None else str(f) for f in firsts)
        table.append(f"| {form} | {differing} of {args.prompts} | {shown} |")
    table += [
        "",
        "| lossless compression of a one-row payload | size / raw | us a payload |",
        "|---|---|---|",
    ]
    payloads = captured[:200]
    for name, compress in COMPRESSORS.items():
        started = time.perf_counter()
        sizes = [len(compress(p)) for p in payloads]
        micros = (time.perf_counter() - started) / len(payloads) * 1e6
        ratio = statistics.median(sizes) / len(payloads[0])
        figures["compression"][name] = {"ratio": ratio, "us": micros, "raw_bytes": len(payloads[0])}
        table.append(f"| {name} | {ratio:.3f} of {len(payloads[0])} B | {micros:.0f} |")
    print("\n".join(table))
    if args.json:
        write_results(args.json, figures, table, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
