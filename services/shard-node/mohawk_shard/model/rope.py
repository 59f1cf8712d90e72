"""Rotary position embeddings (Su et al., RoFormer), in the rotate-half layout Hugging Face uses."""

from __future__ import annotations

from typing import Any

import torch

from mohawk_common.model_store import ModelConfig


def rope_inverse_frequencies(config: ModelConfig, hf_config: Any | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and cos/sin scale; scaled variants (llama3, yarn, ...) come from transformers."""
    if config.rope_scaling is None or hf_config is None:
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = str(config.rope_scaling.get("rope_type", "default"))
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scale)


class RotaryTable:
    """cos/sin for every position up to the context length, looked up once per step for all layers."""

    def __init__(self, config: ModelConfig, hf_config: Any | None, device: torch.device, dtype: torch.dtype):
        inv_freq, scale = rope_inverse_frequencies(config, hf_config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float)
        freqs = torch.outer(positions, inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = (angles.cos() * scale).to(device=device, dtype=dtype)
        # rotate_half(x) = roll(x, half) with its first half negated: the sign lives in the table
        half = angles.shape[-1] // 2
        sign = torch.cat((-torch.ones(half), torch.ones(half)))
        self.sin = (angles.sin() * scale * sign).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of shape [num_tokens, 1, head_dim], broadcasting over heads."""
        return self.cos.index_select(0, positions).unsqueeze(1), self.sin.index_select(
            0, positions
        ).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin for x of shape [num_tokens, num_heads, head_dim].

    `signed_sin` is `RotaryTable`'s: sin with its first half negated, so rotate_half is one roll
    and the whole rotation three kernels (a decode step runs it once per layer, for q and k at once).
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
