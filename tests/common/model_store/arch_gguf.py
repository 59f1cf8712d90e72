"""Random-weight GGUF files of every architecture Mohawk reads, each one a model a user could serve:
the bundled SmolLM2's tokenizer and chat template copied into its metadata, the vocabulary sized to
match, so `mohawk up --model FILE` needs nothing else.

The tokenizer keys (`tokenizer.ggml.*`, `tokenizer.chat_template`) are copied as the bundled file
stores them: a byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`, pre-tokenizer `smollm`).
transformers picks a GGUF tokenizer builder by that model name first (its Gemma and Phi-3
builders apply to sentencepiece vocabularies only), and llama.cpp reads the vocabulary by the same
key whatever the architecture, so one tokenizer serves every file here (transformers' Gemma
tokenizer class adds its `<mask>` as one more id, 49152, past the model's vocabulary: the engine
refuses a prompt holding it as it refuses any id out of range). The weights are what
`tests/common/model_store/gguf_export.py` writes (llama.cpp's converter's names, Gemma's 1 + w norms,
permuted q/k rows of `llama` files, 3-D expert tensors), drawn by transformers' own init and
multiplied by `scale` (default 4, as the engine tests widen theirs) so tokens depend on the input.

usage: python -m tests.common.model_store.arch_gguf OUT_DIR [--hidden 256 --layers 2]   (one file per arch)
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFValueType

from mohawk_common.model_store import bundled_model_path
from tests.common.model_store.gguf_export import export_gguf

TOKENIZER_PREFIX = "tokenizer."
# general.name: llama.cpp sets Phi-3's token attributes by name (a name holding "phi3" makes it look
# up "</s>", which SmolLM2's vocabulary lacks), so the files are named for what they are instead
NAME = "Mohawk random weights, SmolLM2 tokenizer"


@dataclass(frozen=True)
class Arch:
    """One architecture: transformers' model_type, the GGUF architecture llama.cpp writes for it, and
    the config options that make it that architecture."""

    model_type: str
    gguf_arch: str
    options: dict[str, Any] = field(default_factory=dict)
    num_layers: int | None = None  # a fixed count (Gemma 3's sliding period is 6), else the caller's


ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch("llama", "llama", {"tie_word_embeddings": True}),
    "qwen3": Arch("qwen3", "qwen3", {"tie_word_embeddings": True}),
    "phi3": Arch("phi3", "phi3", {"tie_word_embeddings": False}),
    # llama.cpp's sliding period: 2 for Gemma 2 (layer 0 slides), 6 for Gemma 3 (layer 5 is global)
    "gemma2": Arch(
        "gemma2",
        "gemma2",
        {"sliding_window": 512, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    ),
    "gemma3": Arch(
        "gemma3_text",
        "gemma3",
        {
            "sliding_window": 512,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        },
        num_layers=6,
    ),
    "mixtral": Arch("mixtral", "llama", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3moe": Arch(
        "qwen3_moe",
        "qwen3moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "tie_word_embeddings": True},
    ),
}


# A Q4_K_M file's mix as llama.cpp's quantizer writes it: Q4_K matrices, Q6_K for attn_v, ffn_down
# and the output (it spreads Q4_K/Q6_K over ffn_down by layer; all Q6_K here), per GGUF tensor kind.
Q4_K_M = {
    kind: "Q4_K"
    for kind in ("attn_q", "attn_k", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "token_embd")
} | {kind: "Q6_K" for kind in ("attn_v", "ffn_down", "output", "ffn_down_exps")}
Q4_K_M |= {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K"}


@dataclass(frozen=True)
class Shape:
    """The sizes of a random model; rows of K-quant tensors need `hidden` and `intermediate` in
    multiples of 256."""

    hidden: int = 256
    intermediate: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64


@functools.cache
def bundled_tokenizer_fields() -> tuple[tuple[str, Any, tuple[Any, ...]], ...]:
    """`(key, value, value types)` of every tokenizer key of the bundled GGUF, as it stores them."""
    from gguf import GGUFReader

    reader = GGUFReader(str(bundled_model_path()))
    return tuple(
        (key, value.contents(), tuple(value.types))
        for key, value in reader.fields.items()
        if key.startswith(TOKENIZER_PREFIX)
    )


def bundled_vocab_size() -> int:
    return next(len(value) for key, value, _ in bundled_tokenizer_fields() if key == "tokenizer.ggml.tokens")


def build_model(arch: str, shape: Shape = Shape(), scale: float = 4.0, seed: int = 0) -> Any:
    """A random-weight transformers model of `arch` in fp32, vocabulary the bundled tokenizer's;
    matrices multiplied by `scale`, norms jittered around their init."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = ARCHITECTURES[arch]
    token_ids = {key: value for key, value, _ in bundled_tokenizer_fields() if key.endswith("_token_id")}
    config = AutoConfig.for_model(
        spec.model_type,
        vocab_size=bundled_vocab_size(),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=spec.num_layers or shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        bos_token_id=token_ids.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=token_ids.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=token_ids.get("tokenizer.ggml.padding_token_id"),
        **_options(spec, shape),
    )
    torch.manual_seed(seed + sum(map(ord, arch)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(scale) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    return model


def _options(spec: Arch, shape: Shape) -> dict[str, Any]:
    options = dict(spec.options)
    if spec.model_type.startswith("gemma"):
        options["query_pre_attn_scalar"] = shape.head_dim  # llama.cpp's (the file has no key for it)
    if spec.model_type == "qwen3_moe":
        options["moe_intermediate_size"] = shape.intermediate
    return options


def write_arch_gguf(
    path: Path,
    arch: str,
    shape: Shape = Shape(),
    formats: dict[str, str] | None = None,
    scale: float = 4.0,
) -> Any:
    """Write a random `arch` model with the bundled tokenizer and chat template to `path` (tensor
    types per GGUF kind as `export_gguf` takes them, default F32); returns the transformers model
    holding the weights the file decodes to."""
    model = build_model(arch, shape, scale)
    spec = ARCHITECTURES[arch]
    fields = (("general.name", NAME, (GGUFValueType.STRING,)), *bundled_tokenizer_fields())
    export_gguf(path, model, spec.gguf_arch, formats, _architecture_keys(model.config), fields)
    return model


def _architecture_keys(config: Any) -> dict[str, Any]:
    """Keys llama.cpp's converter writes that `export_gguf` leaves to the caller (Qwen3-MoE's
    expert width; `export_gguf` writes the expert counts)."""
    if config.model_type != "qwen3_moe":
        return {}
    return {"expert_feed_forward_length": config.moe_intermediate_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", action="append", choices=sorted(ARCHITECTURES))
    parser.add_argument("--hidden", type=int, default=Shape.hidden)
    parser.add_argument("--layers", type=int, default=Shape.num_layers)
    parser.add_argument("--q4-k-m", action="store_true", help="random K-quant blocks in a Q4_K_M mix")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = Shape(hidden=args.hidden, intermediate=2 * args.hidden, num_layers=args.layers)
    for arch in args.arch or ARCHITECTURES:
        path = args.out / f"random-{arch}.gguf"
        write_arch_gguf(path, arch, shape, Q4_K_M if args.q4_k_m else None)
        print(path)


if __name__ == "__main__":
    main()
