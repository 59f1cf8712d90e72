"""Per-architecture glue of an MLX stage: mlx-lm's own blocks, built for one layer range.

Design. Each architecture Mohawk reads runs on MLX as mlx-lm's own decoder block (llama's for
Llama/Mistral, `qwen2`, `qwen3`, `phi3`, `gemma2`, `gemma3_text`, `mixtral`, `qwen3_moe`), built
here one layer at a time from an mlx-lm `ModelArgs` mapped field by field from our `ModelConfig`,
so nothing that mlx-lm would default silently is left to it: RoPE bases (Gemma 3's local base for
its sliding layers), `query_pre_attn_scalar`, Gemma 2's soft-caps, experts, top-k and
`norm_topk_prob`. Where mlx-lm decides per layer from the layer's index (Gemma 3's sliding/global
pattern, Qwen3-MoE's dense layers) the block gets an index, or a list, that gives the layer the
type our config says, so any `layer_types` works, not only mlx-lm's period of six. Three things
mlx-lm does not do as transformers does are done here instead: a scaled RoPE on Phi-3, Mixtral,
Qwen3-MoE and Gemma is replaced by `TableRope`, the torch stage's own frequencies and cos/sin
scale (transformers' functions; mlx-lm's Phi-3 LongRoPE always uses the long factors, and its
Mixtral/Qwen3-MoE/Gemma 2 ignore scaling); sliding windows are masks the backend builds over the
paged cache (mlx-lm's Gemma 2 never slides); Gemma's embedding scale is sqrt(hidden) in the
compute dtype as transformers and the torch stage apply it (mlx-lm's Gemma 3 rounds it to bf16
first, which would move fp32 logits by ~1e-3). Gemma's norms are mlx-lm's (1 + w) RMSNorm over
the checkpoint's w; a GGUF file's norms, stored as 1 + w, come from the model store as w already.
Weights are loaded under mlx-lm's parameter names, as its `sanitize` would leave them: Phi-3's q/k/v
and gate/up, which the store splits, are concatenated back into `qkv_proj`/`gate_up_proj`; each
MoE layer's experts are stacked into `switch_mlp` (a `SwitchGLU`), quantized groups included.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mohawk_common.errors import ConfigError
from mohawk_common.model_store.config import ModelConfig
from mohawk_common.model_store.source import EMBEDDING, FINAL_NORM

# mlx-lm module per architecture (Mistral's decoder is llama's)
MODULES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
    "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe",
}
GEMMA = ("gemma2", "gemma3_text")
_OWN_ROPE = ("phi3", "mixtral", "qwen3_moe", "gemma2", "gemma3_text")  # scaled RoPE from our table
_DERIVED_HEAD_DIM = ("phi3", "mixtral")  # mlx-lm takes hidden / heads as their head size
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_PHI3_FUSED = {
    "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0, 3),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", 1, 3),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", 2, 3),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0, 2),
    "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1, 2),
}


@dataclass(frozen=True, slots=True)
class Target:
    """Where a canonical tensor goes in mlx-lm's parameters: part `index` of `count` of `path`,
    concatenated along rows (Phi-3's fused projections) or stacked (`stack`: MoE experts)."""

    path: str
    index: int = 0
    count: int = 1
    stack: bool = False


def model_args(config: ModelConfig) -> tuple[Any, Any]:
    """mlx-lm's ModelArgs for `config` and its module; raises ConfigError for what it cannot run."""
    arch = config.architecture
    module = importlib.import_module(f"mlx_lm.models.{MODULES[arch]}")
    if arch in _DERIVED_HEAD_DIM and config.head_dim * config.num_heads != config.hidden_size:
        raise ConfigError(
            f"mlx-lm's {arch} takes hidden / heads as the head size, this model's is {config.head_dim}"
        )
    fields: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        # a scaled RoPE of these is swapped for the torch stage's own (`TableRope`)
        "rope_scaling": None if arch in _OWN_ROPE else config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "partial_rotary_factor": config.partial_rotary_factor,
    }
    if arch in GEMMA:
        fields["query_pre_attn_scalar"] = config.query_pre_attn_scalar or config.head_dim
    if arch == "gemma2":
        if config.attn_logit_softcapping is None:
            raise ConfigError("mlx-lm's gemma2 always soft-caps attention scores; this model does not")
        fields["attn_logit_softcapping"] = config.attn_logit_softcapping
        fields["final_logit_softcapping"] = config.final_logit_softcapping
    if arch == "gemma3_text":
        if config.attn_logit_softcapping is not None:
            raise ConfigError("mlx-lm's gemma3_text does not soft-cap attention scores; this model does")
        fields["rope_local_base_freq"] = config.rope_local_theta or config.rope_theta
        fields["sliding_window"] = config.sliding_window or config.max_position_embeddings
        fields["sliding_window_pattern"] = 2  # layer index 0 slides, 1 attends to all: see `make_layer`
    if arch in ("mixtral", "qwen3_moe"):
        fields["num_experts_per_tok"] = config.num_experts_per_tok
    if arch == "mixtral":
        fields["num_local_experts"] = config.num_experts
    if arch == "qwen3_moe":
        fields["num_experts"] = config.num_experts
        fields["moe_intermediate_size"] = config.moe_intermediate_size
        fields["norm_topk_prob"] = config.norm_topk_prob
        fields["decoder_sparse_step"] = 1
        fields["mlp_only_layers"] = list(config.dense_mlp_layers)
    return module.ModelArgs.from_dict(fields), module


def make_layer(config: ModelConfig, hf_config: Any, args: Any, module: Any, layer: int) -> nn.Module:
    """mlx-lm's block for decoder layer `layer` (model-wide index) of `config`."""
    arch = config.architecture
    if arch == "gemma3_text":
        block = module.TransformerBlock(args, layer_idx=0 if config.layer_window(layer) else 1)
    elif arch == "mixtral":
        block = module.MixtralDecoderLayer(args)
    elif arch == "qwen3_moe":
        block = module.Qwen3MoeDecoderLayer(args, layer_idx=layer)
    else:
        block = module.TransformerBlock(args)
    sliding = config.layer_window(layer) is not None and config.rope_local_theta is not None
    if arch in _OWN_ROPE and config.rope_scaling is not None and not sliding:
        block.self_attn.rope = TableRope(config, hf_config)
    return block


def make_norm(config: ModelConfig, module: Any) -> nn.Module:
    """The final norm: Gemma's scales by (1 + w), the others' by w."""
    if config.architecture in GEMMA:
        return module.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


def embed_scale(config: ModelConfig) -> float | None:
    """What the embedding rows are multiplied by (Gemma: sqrt(hidden)), or None."""
    return config.hidden_size**0.5 if config.architecture in GEMMA else None


def target(config: ModelConfig, name: str, start: int) -> Target:
    """Where canonical tensor `name` (not a tied head) goes in a stage whose first layer is `start`."""
    if name in (EMBEDDING, FINAL_NORM):
        return Target(name.replace("model.", ""))
    if not name.startswith("layers."):
        return Target(name)
    index, rest = name[len("layers.") :].split(".", 1)
    prefix = f"layers.{int(index) - start}."
    arch = config.architecture
    if arch == "phi3" and rest in _PHI3_FUSED:
        path, part, count = _PHI3_FUSED[rest]
        return Target(prefix + path, part, count)
    moe = "block_sparse_moe" if arch == "mixtral" else "mlp"
    expert = _EXPERT.fullmatch(rest)
    if expert is not None:
        path = f"{moe}.switch_mlp.{expert.group(2)}.weight"
        return Target(prefix + path, int(expert.group(1)), config.num_experts, stack=True)
    if rest == "mlp.gate.weight":
        return Target(f"{prefix}{moe}.gate.weight")
    return Target(prefix + rest)


def combine(target: Target, parts: list[mx.array]) -> mx.array:
    """One mlx-lm parameter from its parts in order (one part: itself)."""
    if len(parts) != target.count:
        raise ValueError(f"{target.path}: {len(parts)} parts of {target.count}")
    if target.count == 1:
        return parts[0]
    return mx.stack(parts) if target.stack else mx.concatenate(parts, axis=0)


class TableRope(nn.Module):
    """The torch stage's RoPE (`rope_inverse_frequencies`: transformers' scaled variants, LongRoPE
    with its short factors) in mlx-lm's rope interface, through `mx.fast.rope`'s frequencies."""

    def __init__(self, config: ModelConfig, hf_config: Any) -> None:
        super().__init__()
        from mohawk_shard.model.rope import rope_inverse_frequencies

        inv_freq, scale = rope_inverse_frequencies(config, hf_config)
        self.dims, self.scale = config.rotary_dim, scale
        self._freqs = mx.array((1.0 / inv_freq).numpy())

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        if self.scale != 1.0:  # transformers scales cos and sin: the rotated part, not the rest
            x = mx.concatenate([x[..., : self.dims] * self.scale, x[..., self.dims :]], axis=-1)
        return mx.fast.rope(
            x, self.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )
