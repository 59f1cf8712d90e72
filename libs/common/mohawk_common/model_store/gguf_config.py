"""What transformers' GGUF config reader leaves out, read from the file's own metadata.

Design. transformers maps a GGUF file's metadata onto a config of the matching model type; for
three families that config is not the model llama.cpp runs from the same file, so the settings
are completed here, each from the file's key where it has one and otherwise as llama.cpp derives it
(its `llama-model.cpp` hyperparameter loading), since the file was made for llama.cpp:
- Gemma 2 and Gemma 3 keep the config class's defaults for query_pre_attn_scalar, the soft-caps,
  which layers slide and Gemma 3's rotary bases and scaling. query_pre_attn_scalar is
  `attention.scale`^-2 where the file has it, else hidden / heads for the 27B models (46 layers
  for Gemma 2, 62 for Gemma 3) and head_dim for the rest; Gemma 2's caps default to 50 and 30;
  a layer slides as `attention.sliding_window_pattern` says (a period n, layer i sliding when
  i mod n < n − 1, or one flag a layer), else with llama.cpp's period (2 for Gemma 2, 6 for Gemma 3);
  Gemma 3's sliding layers turn with `rope.freq_base_swa` (else 10,000) unscaled, its full layers
  with `rope.freq_base` and the file's linear `rope.scaling`.
- Mixtral is a `llama` file with `expert_count`, which transformers reads as a dense Llama: the
  config is rebuilt as Mixtral's from the Llama one and the expert keys.
- Qwen3-MoE's `expert_feed_forward_length` is left at the class default.
- Qwen3's (and Llama's, read from the rotary dimension count) head_dim ignores
  `attention.key_length`: llama.cpp's head size is that key where the file has it, so it is too here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.gguf_file import MetadataValue

GEMMA_ARCHITECTURES = frozenset({"gemma2", "gemma3"})
# llama.cpp's Gemma defaults: sliding period, layers of the 27B model, Gemma 2's soft-caps
_SLIDING_PERIOD = {"gemma2": 2, "gemma3": 6}
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}
_GEMMA2_CAPS = (50.0, 30.0)
_GEMMA2_WINDOW = 4096
_LOCAL_ROPE_THETA = 10000.0


def complete_config(
    hf_config: Any,
    arch: str,
    metadata: Mapping[str, MetadataValue],
    arrays: Mapping[str, tuple[MetadataValue, ...]],
) -> Any:
    """`hf_config` as transformers read it from a GGUF of `arch`, completed from the file's
    `metadata` and short `arrays`: the same object, or a new one (Mixtral's)."""
    key_length = metadata.get(f"{arch}.attention.key_length")
    if key_length is not None and hasattr(hf_config, "head_dim"):
        hf_config.head_dim = int(key_length)
    experts_ffn = metadata.get(f"{arch}.expert_feed_forward_length")
    if arch == "qwen3moe" and experts_ffn is not None:
        hf_config.moe_intermediate_size = int(experts_ffn)
    if arch in GEMMA_ARCHITECTURES:
        _complete_gemma(hf_config, arch, _Keys(arch, metadata, arrays))
    if arch in ("llama", "mistral") and int(metadata.get(f"{arch}.expert_count", 0) or 0) > 0:
        return _mixtral_config(hf_config, _Keys(arch, metadata, arrays))
    return hf_config


class _Keys:
    """The architecture's keys (`gemma2.attention.sliding_window` as `get("attention.sliding_window")`)."""

    def __init__(
        self,
        arch: str,
        metadata: Mapping[str, MetadataValue],
        arrays: Mapping[str, tuple[MetadataValue, ...]],
    ) -> None:
        self.arch, self._metadata, self._arrays = arch, metadata, arrays

    def get(self, key: str) -> MetadataValue | None:
        return self._metadata.get(f"{self.arch}.{key}")

    def array(self, key: str) -> tuple[MetadataValue, ...] | None:
        return self._arrays.get(f"{self.arch}.{key}")


def _complete_gemma(hf_config: Any, arch: str, keys: _Keys) -> None:
    layers, hidden = int(hf_config.num_hidden_layers), int(hf_config.hidden_size)
    heads = int(hf_config.num_attention_heads)
    scale = keys.get("attention.scale")
    if scale is not None:
        hf_config.query_pre_attn_scalar = float(scale) ** -2
    elif layers == _LAYERS_27B[arch]:
        hf_config.query_pre_attn_scalar = hidden // heads
    else:
        hf_config.query_pre_attn_scalar = int(hf_config.head_dim)
    final_cap = keys.get("final_logit_softcapping")
    if arch == "gemma2":
        attn_cap = keys.get("attn_logit_softcapping")
        hf_config.attn_logit_softcapping = float(_GEMMA2_CAPS[0] if attn_cap is None else attn_cap)
        hf_config.final_logit_softcapping = float(_GEMMA2_CAPS[1] if final_cap is None else final_cap)
    else:
        hf_config.attn_logit_softcapping = None
        hf_config.final_logit_softcapping = None if final_cap is None else float(final_cap)
        hf_config.rope_parameters = _gemma3_rope(keys)
    window = keys.get("attention.sliding_window")
    if window is None and arch == "gemma2":
        window = _GEMMA2_WINDOW
    hf_config.sliding_window = None if window is None else int(window)
    sliding = _sliding_flags(arch, layers, keys) if window is not None else [False] * layers
    hf_config.layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]


def _sliding_flags(arch: str, num_layers: int, keys: _Keys) -> list[bool]:
    flags = keys.array("attention.sliding_window_pattern")
    if flags is not None:
        if len(flags) != num_layers:
            raise ModelLoadError(
                f"{arch}.attention.sliding_window_pattern has {len(flags)} entries for {num_layers} layers"
            )
        return [bool(flag) for flag in flags]
    period = int(keys.get("attention.sliding_window_pattern") or _SLIDING_PERIOD[arch])
    return [period == 0 or layer % period < period - 1 for layer in range(num_layers)]


def _gemma3_rope(keys: _Keys) -> dict[str, dict[str, Any]]:
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(keys.get("rope.freq_base") or 1e6)}
    scaling = str(keys.get("rope.scaling.type") or "none")
    factor = float(keys.get("rope.scaling.factor") or 1.0)
    if scaling == "linear" and factor != 1.0:
        full.update(rope_type="linear", factor=factor)
    elif scaling not in ("none", "linear"):
        raise ModelLoadError(f"unsupported gemma3 GGUF: rope scaling {scaling!r}")
    local = float(keys.get("rope.freq_base_swa") or _LOCAL_ROPE_THETA)
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def _mixtral_config(llama: Any, keys: _Keys) -> Any:
    from transformers import AutoConfig

    experts_ffn = keys.get("expert_feed_forward_length")
    inter = int(experts_ffn) if experts_ffn is not None else int(llama.intermediate_size)
    config = AutoConfig.for_model(
        "mixtral",
        vocab_size=llama.vocab_size,
        hidden_size=llama.hidden_size,
        intermediate_size=inter,
        num_hidden_layers=llama.num_hidden_layers,
        num_attention_heads=llama.num_attention_heads,
        num_key_value_heads=llama.num_key_value_heads,
        head_dim=getattr(llama, "head_dim", None),
        max_position_embeddings=llama.max_position_embeddings,
        rms_norm_eps=llama.rms_norm_eps,
        rope_parameters=dict(getattr(llama, "rope_parameters", None) or {}) or None,
        tie_word_embeddings=llama.tie_word_embeddings,
        bos_token_id=llama.bos_token_id,
        eos_token_id=llama.eos_token_id,
        sliding_window=None,
        num_local_experts=int(keys.get("expert_count") or 0),
        num_experts_per_tok=int(keys.get("expert_used_count") or 0),
    )
    config._name_or_path = getattr(llama, "_name_or_path", "")
    return config
