"""Rotary position embeddings (Su et al., RoFormer), in the rotate-half layout Hugging Face uses.

A model may rotate only the first `rotary_dim` dimensions of each head (Phi's partial rotary), and
may rotate sliding-window layers with a base of their own (Gemma 3's local base): the table then
holds a second cos/sin for those layers. LongRoPE (Phi-3) is exact up to the pretraining length,
where Hugging Face uses its short factors; `config_from_hf` caps the context there.
"""

from __future__ import annotations

from typing import Any

import torch

from mohawk_common.model_store import ModelConfig


def rope_inverse_frequencies(
    config: ModelConfig, hf_config: Any | None, *, local: bool = False
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and cos/sin scale; scaled variants (llama3, yarn, ...) come from transformers.

    `local` asks for the sliding-window layers' frequencies of a model with two bases (Gemma 3).
    """
    dim = config.rotary_dim
    if local:
        theta = config.rope_local_theta or config.rope_theta
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if config.rope_scaling is None or hf_config is None:
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = str(config.rope_scaling.get("rope_type", "default"))
    # per-layer-type rope (Gemma 3) keeps the full-attention layers' scaling under their type
    kwargs = {"layer_type": "full_attention"} if config.rope_local_theta is not None else {}
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **kwargs)
    return inv_freq.float(), float(scale)


class RotaryTable:
    """cos/sin for every position up to the context length, looked up once per step for all layers."""

    def __init__(self, config: ModelConfig, hf_config: Any | None, device: torch.device, dtype: torch.dtype):
        self.cos, self.sin = _table(config, *rope_inverse_frequencies(config, hf_config), device, dtype)
        self.local: tuple[torch.Tensor, torch.Tensor] | None = None
        if config.rope_local_theta is not None:
            inv_freq, scale = rope_inverse_frequencies(config, hf_config, local=True)
            self.local = _table(config, inv_freq, scale, device, dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of shape [num_tokens, 1, rotary_dim], broadcasting over heads."""
        return _rows(self.cos, self.sin, positions)

    def lookup_local(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """As `lookup`, for the sliding-window layers of a model with a local base; None without one."""
        return None if self.local is None else _rows(*self.local, positions)


def _table(
    config: ModelConfig, inv_freq: torch.Tensor, scale: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float)
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos = (angles.cos() * scale).to(device=device, dtype=dtype)
    # rotate_half(x) = roll(x, half) with its first half negated: the sign lives in the table
    half = angles.shape[-1] // 2
    sign = torch.cat((-torch.ones(half), torch.ones(half)))
    return cos, (angles.sin() * scale * sign).to(device=device, dtype=dtype)


def _rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return cos.index_select(0, positions).unsqueeze(1), sin.index_select(0, positions).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin for x of shape [num_tokens, num_heads, head_dim].

    `signed_sin` is `RotaryTable`'s: sin with its first half negated, so rotate_half is one roll
    and the whole rotation three kernels (a decode step runs it once per layer, for q and k at once).
    When the table is narrower than the head (partial rotary), the rest of each head passes through.
    """
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return torch.addcmul(x * cos, x.roll(rotary_dim // 2, dims=-1), signed_sin)
    rotated, kept = x.split([rotary_dim, x.shape[-1] - rotary_dim], dim=-1)
    rotated = torch.addcmul(rotated * cos, rotated.roll(rotary_dim // 2, dims=-1), signed_sin)
    return torch.cat((rotated, kept), dim=-1)
