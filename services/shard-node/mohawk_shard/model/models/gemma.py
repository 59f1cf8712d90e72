"""Gemma 2 and Gemma 3 text decoders (Gemma Team, 2024 and 2025).

Pre- and post-norm around both sublayers: x += Norm(Attn(Norm(x))); x += Norm(MLP(Norm(x))),
every norm an RMSNorm scaling by (1 + w). Embeddings are multiplied by sqrt(hidden); the MLP is
gated with tanh-GELU; attention scores are scaled by query_pre_attn_scalar^-1/2 instead of
head_dim^-1/2. Layers alternate between a sliding window and full attention as the config's
`layer_types` say. Gemma 2 soft-caps attention scores and the final logits (cap·tanh(s / cap));
Gemma 3 drops the caps, normalises each head's queries and keys, and rotates sliding layers with
a local base (10k) and full layers with the global one (1M, possibly scaled).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.attention import AttentionMetadata
from mohawk_shard.model.blocks import Attention, GatedMLP, OffsetRMSNorm, Take
from mohawk_shard.model.kv_cache import KVCache
from mohawk_shard.model.stage import DecoderLayer, DecoderStage

_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = OffsetRMSNorm(size, eps)
        self.self_attn = Attention(config, layer, norm=OffsetRMSNorm)
        self.post_attention_layernorm = OffsetRMSNorm(size, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(size, eps)
        self.mlp = GatedMLP(config)
        self.post_feedforward_layernorm = OffsetRMSNorm(size, eps)

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the dense tensors; a matmul already swapped for a quantized layer is skipped."""
        for name in _NORMS:
            getattr(self, name).weight.copy_(take(f"{prefix}{name}.weight"))
        self.self_attn.load_weights(take, prefix + "self_attn.")
        self.mlp.load_weights(take, prefix + "mlp.")

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        attended = self.self_attn.forward(self.input_layernorm.forward(x), meta, cache)
        x = x + self.post_attention_layernorm.forward(attended)
        mixed = self.mlp.forward(self.pre_feedforward_layernorm.forward(x))
        return x + self.post_feedforward_layernorm.forward(mixed)


class GemmaStage(DecoderStage):
    """Layers [start, end) of a Gemma 2 or Gemma 3 text model."""

    norm_class = OffsetRMSNorm

    def make_layer(self, config: ModelConfig, layer: int) -> DecoderLayer:
        return GemmaDecoderLayer(config, layer)

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.config.hidden_size)
