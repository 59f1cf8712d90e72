"""`ModelConfig`: the few numbers Mohawk needs about a decoder, read from a transformers config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from mohawk_common.errors import ModelLoadError

Architecture = Literal[
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe"
]
Activation = Literal["silu", "gelu_tanh"]
SUPPORTED_ARCHITECTURES: tuple[str, ...] = get_args(Architecture)
DEFAULT_ROPE_THETA = 10000.0
FP32_BYTES = 4


class ModelConfig(BaseModel):
    """Shape and numerics of a Llama-style decoder, independent of where its weights live."""

    model_config = ConfigDict(frozen=True)

    model_id: str
    architecture: Architecture
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    # layer indices the sliding window applies to; None: every layer (Mistral, Phi-3)
    sliding_layers: tuple[int, ...] | None = None
    partial_rotary_factor: float = 1.0
    hidden_activation: Activation = "silu"
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_local_theta: float | None = None  # sliding layers' rotary base when it differs (Gemma 3)
    # mixture of experts (Mixtral, Qwen3-MoE): 0 experts means every MLP is dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    dense_mlp_layers: tuple[int, ...] = ()  # layers of a MoE model whose MLP is dense (Qwen3-MoE)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that are rotated (all, unless partial rotary)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of decoder layer `layer`, or None when it attends to all its context."""
        if self.sliding_window is None or (
            self.sliding_layers is not None and layer not in self.sliding_layers
        ):
            return None
        return self.sliding_window

    @property
    def num_layer_norms(self) -> int:
        """Hidden-size norms per decoder layer: Gemma adds one after attention and one after the MLP."""
        return 4 if self.architecture in ("gemma2", "gemma3_text") else 2

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer`'s MLP is a routed mixture of experts."""
        return self.num_experts > 0 and layer not in self.dense_mlp_layers

    @property
    def weight_bytes_per_layer(self) -> int:
        """Bytes of the largest decoder layer's weights held as fp32 (what `load_weights` returns):
        a MoE layer counts every expert and the router, as a stage holds them all."""
        return max(self.layer_weight_bytes(i) for i in self._layer_kinds())

    def _layer_kinds(self) -> list[int]:
        """One layer of each MLP kind (dense, MoE) the model has."""
        moe = next((i for i in range(self.num_layers) if self.is_moe_layer(i)), None)
        dense = next((i for i in range(self.num_layers) if not self.is_moe_layer(i)), None)
        return [i for i in (moe, dense) if i is not None] or [0]

    def layer_weight_bytes(self, layer: int) -> int:
        """Bytes of decoder layer `layer`'s weights held as fp32."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q_size + 2 * kv_size)
        mlp = 3 * self.hidden_size * self.intermediate_size
        if self.is_moe_layer(layer):  # every expert's gate/up/down, and the router
            mlp = self.num_experts * (3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size)
        norms = self.num_layer_norms * self.hidden_size
        biases = q_size + 2 * kv_size if self.attention_bias else 0
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        return FP32_BYTES * (attention + mlp + norms + biases + qk_norms)


def check_architecture(model_type: object, path: Path | None = None) -> Architecture:
    """Return `model_type` if Mohawk runs it, else raise `ModelLoadError` naming it (and `path`,
    the file that declares it)."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        where = f"{path}: " if path is not None else ""
        raise ModelLoadError(f"{where}unsupported architecture {model_type!r} (supported: {supported})")
    return model_type  # type: ignore[return-value]


def config_from_hf(hf_config: Any, model_id: str, extra_eos_token_ids: tuple[int, ...] = ()) -> ModelConfig:
    """Build a `ModelConfig` from a transformers `PretrainedConfig` of a supported architecture."""
    architecture = check_architecture(getattr(hf_config, "model_type", None))
    _reject_unsupported_biases(hf_config, architecture)
    num_heads = int(hf_config.num_attention_heads)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    rope = read_rope(hf_config, architecture)
    window, sliding_layers = _sliding_window(hf_config, architecture)
    gemma = architecture in ("gemma2", "gemma3_text")
    return ModelConfig(
        model_id=model_id,
        architecture=architecture,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        vocab_size=hf_config.vocab_size,
        rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=rope.theta,
        rope_scaling=rope.scaling,
        max_position_embeddings=rope.max_positions or hf_config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention_bias=architecture == "qwen2",
        qk_norm=architecture in ("qwen3", "qwen3_moe", "gemma3_text"),
        bos_token_id=getattr(hf_config, "bos_token_id", None),
        eos_token_ids=_merge_ids(getattr(hf_config, "eos_token_id", None), extra_eos_token_ids),
        sliding_window=window,
        sliding_layers=sliding_layers,
        partial_rotary_factor=rope.partial_rotary_factor,
        hidden_activation=_activation(hf_config, architecture),
        query_pre_attn_scalar=getattr(hf_config, "query_pre_attn_scalar", None) if gemma else None,
        attn_logit_softcapping=getattr(hf_config, "attn_logit_softcapping", None) if gemma else None,
        final_logit_softcapping=getattr(hf_config, "final_logit_softcapping", None) if gemma else None,
        rope_local_theta=rope.local_theta,
        **_experts(hf_config, architecture),
    )


def generation_eos_token_ids(directory: Path) -> tuple[int, ...]:
    """The `eos_token_id`(s) of a directory's generation_config.json, or () without one."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    return _merge_ids(data.get("eos_token_id") if isinstance(data, dict) else None, ())


def _reject_unsupported_biases(hf_config: Any, architecture: Architecture) -> None:
    # Llama/Qwen3 `attention_bias` also puts a bias on o_proj, and `mlp_bias` on the MLP: Mohawk's
    # layers have neither, so such checkpoints would run wrong rather than fail; refuse them here.
    if architecture != "qwen2" and getattr(hf_config, "attention_bias", False):
        raise ModelLoadError(f"unsupported {architecture} variant: attention_bias=true")
    if getattr(hf_config, "mlp_bias", False):
        raise ModelLoadError(f"unsupported {architecture} variant: mlp_bias=true")


def _experts(hf_config: Any, architecture: Architecture) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral or Qwen3-MoE config; none for a dense model."""
    dense_layers: tuple[int, ...] = ()
    if architecture == "mixtral":
        num_experts, inter = int(hf_config.num_local_experts), int(hf_config.intermediate_size)
        renormalize = True
    elif architecture == "qwen3_moe":
        num_experts, inter = int(hf_config.num_experts), int(hf_config.moe_intermediate_size)
        renormalize = bool(getattr(hf_config, "norm_topk_prob", False))
        only = set(getattr(hf_config, "mlp_only_layers", None) or ())
        step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
        layers = range(int(hf_config.num_hidden_layers))
        dense_layers = tuple(i for i in layers if i in only or num_experts == 0 or (i + 1) % step)
    else:
        return {}
    top_k = int(hf_config.num_experts_per_tok)
    if num_experts > 0 and not 0 < top_k <= num_experts:
        raise ModelLoadError(f"unsupported {architecture} variant: {top_k} experts a token of {num_experts}")
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": inter,
        "norm_topk_prob": renormalize,
        "dense_mlp_layers": dense_layers,
    }


def _activation(hf_config: Any, architecture: Architecture) -> Activation:
    # Gemma names it hidden_activation (hidden_act in older configs); the rest hidden_act
    name = getattr(hf_config, "hidden_activation", None) or getattr(hf_config, "hidden_act", None) or "silu"
    wanted = "gelu_tanh" if architecture in ("gemma2", "gemma3_text") else "silu"
    if _ACTIVATIONS.get(name) != wanted:
        raise ModelLoadError(f"unsupported {architecture} variant: activation {name!r}")
    return wanted


_ACTIVATIONS: dict[str, Activation] = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True, slots=True)
class RopeSettings:
    """What `ModelConfig` keeps of a config's rotary settings."""

    theta: float
    scaling: dict[str, Any] | None
    partial_rotary_factor: float = 1.0
    local_theta: float | None = None
    max_positions: int | None = None  # a cap on the context below max_position_embeddings


def read_rope(hf_config: Any, architecture: Architecture) -> RopeSettings:
    """Rotary settings; raises ModelLoadError for a variant Mohawk would compute wrong."""
    # transformers 5 keeps RoPE settings in `rope_parameters`; older configs in rope_theta/rope_scaling.
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    params = dict(params)
    local_theta = None
    if "full_attention" in params:  # one set per layer type (Gemma 3)
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise ModelLoadError(f"unsupported {architecture} variant: scaled rope on sliding layers")
        local_theta = float(local.get("rope_theta") or DEFAULT_ROPE_THETA)
        params = dict(params["full_attention"] or {})
    theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or DEFAULT_ROPE_THETA
    rope_type = params.get("rope_type", params.get("type", "default"))
    factor = float(
        params.get("partial_rotary_factor") or getattr(hf_config, "partial_rotary_factor", 1.0) or 1.0
    )
    scaling = params if rope_type != "default" else None
    cap = None
    if rope_type in ("longrope", "su"):
        # Hugging Face switches every position to the long factors once a sequence passes the
        # pretraining length (and keeps earlier keys rotated by the short ones): up to that
        # length the short factors are exact, so the context stops there
        cap = params.get("original_max_position_embeddings") or getattr(
            hf_config, "original_max_position_embeddings", None
        )
        if cap is None:
            raise ModelLoadError(
                f"unsupported {architecture} variant: longrope without original_max_position_embeddings"
            )
        cap = min(int(cap), int(hf_config.max_position_embeddings))
    elif rope_type not in _ROPE_TYPES:
        raise ModelLoadError(f"unsupported {architecture} variant: rope_type {rope_type!r}")
    return RopeSettings(float(theta), scaling, factor, local_theta, cap)


# `dynamic` rescales with the sequence length, which one fixed table cannot follow
_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def _sliding_window(hf_config: Any, architecture: Architecture) -> tuple[int | None, tuple[int, ...] | None]:
    """The window and the layers it applies to (None: all layers), as Hugging Face applies them."""
    window = getattr(hf_config, "sliding_window", None)
    if window is None or not getattr(hf_config, "use_sliding_window", True):
        return None, None
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ModelLoadError(f"unsupported {architecture} variant: use_bidirectional_attention=true")
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is None and architecture in ("gemma2", "gemma3_text"):
        raise ModelLoadError(f"{architecture} config without layer_types: cannot tell sliding layers")
    if layer_types is None:
        return int(window), None
    return int(window), tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")


def _merge_ids(first: object, more: tuple[int, ...]) -> tuple[int, ...]:
    ids = [first] if isinstance(first, int) else list(first) if isinstance(first, list | tuple) else []
    return tuple(dict.fromkeys([int(i) for i in ids] + list(more)))
