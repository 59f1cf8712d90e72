"""`ModelConfig`: the few numbers Mohawk needs about a decoder, read from a transformers config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from mohawk_common.errors import ModelLoadError

Architecture = Literal["llama", "mistral", "qwen2", "qwen3"]
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

    @property
    def weight_bytes_per_layer(self) -> int:
        """Bytes of one decoder layer's weights held as fp32 (what `load_weights` returns)."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q_size + 2 * kv_size)
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
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
    rope_theta, rope_scaling = _rope(hf_config)
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
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=hf_config.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        attention_bias=architecture == "qwen2",
        qk_norm=architecture == "qwen3",
        bos_token_id=getattr(hf_config, "bos_token_id", None),
        eos_token_ids=_merge_ids(getattr(hf_config, "eos_token_id", None), extra_eos_token_ids),
        sliding_window=_sliding_window(hf_config),
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


def _rope(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    # transformers 5 keeps RoPE settings in `rope_parameters`; older configs in rope_theta/rope_scaling.
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    params = dict(params)
    theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or DEFAULT_ROPE_THETA
    rope_type = params.get("rope_type", params.get("type", "default"))
    return float(theta), (params if rope_type != "default" else None)


def _sliding_window(hf_config: Any) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if window is None or not getattr(hf_config, "use_sliding_window", True):
        return None
    return int(window)


def _merge_ids(first: object, more: tuple[int, ...]) -> tuple[int, ...]:
    ids = [first] if isinstance(first, int) else list(first) if isinstance(first, list | tuple) else []
    return tuple(dict.fromkeys([int(i) for i in ids] + list(more)))
