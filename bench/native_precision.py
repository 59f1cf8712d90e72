"""How close native 4-bit weights come to the fp32-dequantized path, on the bundled model.

Prints, for six varied chat prompts and 48 greedy tokens each:
  * how many whole answers are identical between `--weights native` and `--weights fp32`;
  * teacher-forced along the fp32 answers: at how many positions native picks the same next token,
    and the fp32 path's gap between its two best logits where it does not;
  * the largest logit difference on the fp32 path's top-5 tokens and over the whole vocabulary
    (where the 4-bit head's unrescored tail shows);
  * where the difference comes from: the prompt's logits with the tinygemm kernel run with fp32
    activations, scales and outputs (the same codes, no bf16 anywhere), with bf16 scales only, and
    with bf16 outputs only.
`python bench/native_precision.py` (about two minutes on 2 cores).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from mohawk_common.chat import encode_chat
from mohawk_common.logging import configure_logging
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.quantized_layers import Int4Linear

PROMPTS = [
    "What is the capital of France? Tell me about it.",
    "Write a haiku about the sea.",
    "Explain how a bicycle works in three sentences.",
    "List five fruits and their colors.",
    "What is 17 times 23? Show your work.",
    "Give me a short story opening about a robot who learns to paint.",
]
NUM_TOKENS = 48
Int4Forward = Callable[[Int4Linear, torch.Tensor], torch.Tensor]


def all_logits(backend: TorchBackend, tokens: list[int]) -> torch.Tensor:
    num_blocks = -(-len(tokens) // 16)
    backend.allocate_kv_cache(num_blocks, 16)
    batch = ForwardBatch.build([(tokens, 0, list(range(num_blocks)), True)], 16, all_logits=True)
    return backend.forward(batch, None).float()


@contextmanager
def int4_forward(forward: Int4Forward) -> Iterator[None]:
    original = Int4Linear.forward
    Int4Linear.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        Int4Linear.forward = original  # type: ignore[method-assign]


def fp32_kernel(
    round_scales: bool, round_outputs: bool
) -> Callable[[Int4Linear, torch.Tensor], torch.Tensor]:
    """The same codes through the kernel's fp32 path, with the chosen parts rounded to bf16."""

    def forward(self: Int4Linear, x: torch.Tensor) -> torch.Tensor:
        exact = getattr(self, "exact_pairs", None)  # the head's 4-bit pass has none: it is rescored
        pairs = exact if exact is not None and not round_scales else self.scales_and_zeros.float()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.float(), self.packed, self.group_size, pairs)
        return y.bfloat16().float() if round_outputs else y

    return forward


def attach_exact_pairs(backend: TorchBackend, source: ModelSource) -> None:
    """Give every 4-bit layer its scales and zeros in fp32, rebuilt from the file's blocks."""
    from mohawk_common.model_store.quantized import concat_rows
    from mohawk_shard.model.weight_formats import LAYER_MATMULS

    for offset, layer in enumerate(backend.model.layers):
        for path, parts in LAYER_MATMULS.items():
            module = layer.get_submodule(path)
            if not isinstance(module, Int4Linear):
                continue
            names = [f"layers.{backend.start + offset}.{p}.weight" for p in parts]
            group = concat_rows([t for n in names if (t := source.read_quantized(n)) is not None])
            scales = torch.from_numpy(group.scales)
            mins = torch.from_numpy(group.mins) if group.mins is not None else torch.zeros_like(scales)
            exact = torch.stack((scales, mins + 8 * scales), dim=-1).transpose(0, 1).contiguous()
            object.__setattr__(module, "exact_pairs", exact)


def main() -> None:
    configure_logging("warning")
    source = open_model(None)
    tokenizer = source.load_tokenizer()
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS)
    answers = {
        w: build_local_engine(EngineSettings(weights=w)).generate(prompts, greedy) for w in ("fp32", "native")
    }
    same_text = sum(a.text == b.text for a, b in zip(answers["fp32"], answers["native"], strict=True))
    print(f"identical {NUM_TOKENS}-token greedy answers: {same_text} of {len(PROMPTS)}")

    dense = make_backend("torch", source, 0, source.config.num_layers, device="cpu", weights="fp32")
    native = make_backend("torch", source, 0, source.config.num_layers, device="cpu", weights="native")
    agree = total = 0
    gaps: list[float] = []
    top_diff = all_diff = 0.0
    for prompt, answer in zip(prompts, answers["fp32"], strict=True):
        tokens = prompt + answer.token_ids
        ref = all_logits(dense, tokens)[len(prompt) - 1 :]
        got = all_logits(native, tokens)[len(prompt) - 1 :]
        same = ref.argmax(-1) == got.argmax(-1)
        agree, total = agree + int(same.sum()), total + len(same)
        best = ref.topk(2, dim=-1).values
        gaps += [float(best[i, 0] - best[i, 1]) for i in (~same).nonzero().flatten().tolist()]
        top5 = ref.topk(5, dim=-1).indices
        top_diff = max(top_diff, float((ref.gather(-1, top5) - got.gather(-1, top5)).abs().max()))
        all_diff = max(all_diff, float((ref - got).abs().max()))
    print(f"teacher-forced: same next token at {agree} of {total} positions; fp32 top-2 gaps where not:")
    print(f"  {[round(g, 3) for g in gaps]}")
    print(f"largest logit difference: {top_diff:.3f} on the fp32 top-5, {all_diff:.3f} over the vocabulary")

    assert isinstance(native, TorchBackend) and isinstance(dense, TorchBackend)
    attach_exact_pairs(native, source)
    ref = all_logits(dense, prompts[2])
    top5 = ref.topk(5, dim=-1).indices
    for label, scales, outputs in (
        ("fp32 activations, scales, outputs", False, False),
        ("bf16 scales only", True, False),
        ("bf16 outputs only", False, True),
    ):
        with int4_forward(fp32_kernel(scales, outputs)):
            got = all_logits(native, prompts[2])
        diff = float((got.gather(-1, top5) - ref.gather(-1, top5)).abs().max())
        print(f"prompt logits (top-5), kernel with {label}: max |difference| {diff:.2e}")


if __name__ == "__main__":
    main()
