"""How close native 4-bit weights come to the fp32-dequantized path on the bundled model, beside llama.cpp.

The native path multiplies the file's 4-bit codes by activations quantized to int8 a group of 32
(`kernels/int4_rows.cpp`), as llama.cpp's CPU dot products do. This prints, for six varied chat
prompts and 48 greedy tokens each:
  * how many whole answers are identical between `--weights native` and `--weights fp32`, and
    between llama.cpp's greedy answers and the fp32 path's;
  * teacher-forced along the fp32 answers, for Mohawk native and for llama.cpp (llama-cpp-python
    on the same GGUF, same token ids; skipped when it is not installed): at how many positions each
    picks the fp32 path's next token, the fp32 path's gap between its two best logits where it does
    not, and the mean and largest logit difference on the fp32 path's top-8 tokens at every position.
Both sides are measured against the same fp32 logits, so their rows compare directly.
`python bench/native_precision.py [--threads 2] [--json F]` (about three minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
from results_file import write_results
from runners import LLAMA_CPP_MISSING, llama_cpp_version

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import open_model
from mohawk_common.model_store.store import bundled_model_path
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine
from mohawk_shard.model.forward_batch import ForwardBatch

PROMPTS = [
    "What is the capital of France? Tell me about it.",
    "Write a haiku about the sea.",
    "Explain how a bicycle works in three sentences.",
    "List five fruits and their colors.",
    "What is 17 times 23? Show your work.",
    "Give me a short story opening about a robot who learns to paint.",
]
NUM_TOKENS = 48
TOP = 8  # the fp32 path's best tokens at a position: the ones sampling and greedy choose among


@dataclass
class Agreement:
    """One side's logits against the fp32 path's, teacher-forced along the fp32 answers."""

    name: str
    same: int = 0
    positions: int = 0
    gaps: list[float] = field(default_factory=list)  # the fp32 top-2 gap where the side differs
    top_sum: float = 0.0  # of |difference| over the fp32 top-TOP logits
    top_count: int = 0
    top_max: float = 0.0

    def add(self, ref: torch.Tensor, got: torch.Tensor) -> None:
        same = ref.argmax(-1) == got.argmax(-1)
        self.same += int(same.sum())
        self.positions += len(same)
        best = ref.topk(2, dim=-1).values
        self.gaps += [round(float(best[i, 0] - best[i, 1]), 3) for i in (~same).nonzero().flatten().tolist()]
        top = ref.topk(TOP, dim=-1).indices
        diff = (ref.gather(-1, top) - got.gather(-1, top)).abs()
        self.top_sum += float(diff.sum())
        self.top_count += diff.numel()
        self.top_max = max(self.top_max, float(diff.max()))

    def row(self) -> str:
        mean = self.top_sum / max(self.top_count, 1)
        gaps = ", ".join(f"{g:.3f}" for g in sorted(self.gaps, reverse=True))
        agree = f"{self.same} of {self.positions}"
        cells = (self.name, agree, gaps or "-", f"{mean:.3f}", f"{self.top_max:.3f}")
        return "| " + " | ".join(cells) + " |"


def all_logits(backend: TorchBackend, tokens: list[int]) -> torch.Tensor:
    num_blocks = -(-len(tokens) // 16)
    backend.allocate_kv_cache(num_blocks, 16)
    batch = ForwardBatch.build([(tokens, 0, list(range(num_blocks)), True)], 16, all_logits=True)
    return backend.forward(batch, None).float()


class LlamaCppLogits:
    """llama.cpp's logits at every position of a token sequence, same file."""

    def __init__(self, path: Path, threads: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(path), logits_all=True, n_threads=threads, n_ctx=1024, verbose=False
        )

    def greedy(self, prompt: list[int], num_tokens: int, eos: set[int]) -> list[int]:
        """Up to `num_tokens` argmax tokens after `prompt`, the EOS that ends them included."""
        self.llm.reset()
        self.llm.eval(prompt)
        out: list[int] = []
        while len(out) < num_tokens:
            out.append(int(np.asarray(self.llm.scores[self.llm.n_tokens - 1]).argmax()))
            if out[-1] in eos:
                break
            self.llm.eval(out[-1:])
        return out

    def __call__(self, tokens: list[int]) -> torch.Tensor:
        self.llm.reset()
        self.llm.eval(tokens)
        return torch.from_numpy(np.array(self.llm.scores[: len(tokens)], dtype=np.float32))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here, stamped")
    args = parser.parse_args(argv)
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    source = open_model(None)
    tokenizer = source.load_tokenizer()
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS)
    answers = {
        w: build_local_engine(EngineSettings(weights=w)).generate(prompts, greedy) for w in ("fp32", "native")
    }
    same_text = sum(a.text == b.text for a, b in zip(answers["fp32"], answers["native"], strict=True))
    print(f"identical {NUM_TOKENS}-token greedy answers, native against fp32: {same_text} of {len(PROMPTS)}")

    llama = LlamaCppLogits(bundled_model_path(), args.threads) if llama_cpp_version() else None
    llama_same = None
    if llama is not None:
        eos = set(source.config.eos_token_ids)
        llama_answers = [llama.greedy(p, NUM_TOKENS, eos) for p in prompts]
        fp32_ids = [[t for t in a.token_ids if t not in eos] for a in answers["fp32"]]
        ends = [[t for t in answer if t not in eos] for answer in llama_answers]
        llama_same = sum(ours == theirs for ours, theirs in zip(fp32_ids, ends, strict=True))
        print(f"identical greedy answers, llama.cpp against fp32: {llama_same} of {len(PROMPTS)}")

    layers = source.config.num_layers
    dense = make_backend("torch", source, 0, layers, device="cpu", weights="fp32")
    native = make_backend("torch", source, 0, layers, device="cpu", weights="native")
    assert isinstance(native, TorchBackend) and isinstance(dense, TorchBackend)
    sides = [Agreement("Mohawk native")] + ([Agreement(f"llama.cpp {llama_cpp_version()}")] if llama else [])
    with torch.inference_mode():
        for prompt, answer in zip(prompts, answers["fp32"], strict=True):
            tokens = prompt + answer.token_ids
            ref = all_logits(dense, tokens)[len(prompt) - 1 :]
            sides[0].add(ref, all_logits(native, tokens)[len(prompt) - 1 :])
            if llama is not None:
                sides[1].add(ref, llama(tokens)[len(prompt) - 1 :])
    lines = [
        f"Teacher-forced along the fp32 path's greedy answers ({len(PROMPTS)} prompts, {NUM_TOKENS} tokens):",
        "",
        "| side | fp32's next token | fp32 top-2 gaps where not "
        f"| mean \\|diff\\| top-{TOP} | max \\|diff\\| top-{TOP} |",
        "|---|---|---|---|---|",
        *(side.row() for side in sides),
    ]
    if llama is None:
        lines.append(f"\nllama.cpp: {LLAMA_CPP_MISSING}")
    lines[:0] = [
        f"Identical {NUM_TOKENS}-token greedy answers against the fp32 path: Mohawk native {same_text} of "
        f"{len(PROMPTS)}, llama.cpp {'-' if llama_same is None else llama_same} of {len(PROMPTS)}.",
        "",
    ]
    table = "\n".join(lines)
    print(table)
    if args.json:
        figures = {
            "threads": args.threads,
            "identical_answers": same_text,
            "llama_cpp_identical_answers": llama_same,
            "prompts": len(PROMPTS),
            "tokens": NUM_TOKENS,
            "sides": [asdict(side) for side in sides],
        }
        write_results(args.json, figures, table, argv)


if __name__ == "__main__":
    main()
