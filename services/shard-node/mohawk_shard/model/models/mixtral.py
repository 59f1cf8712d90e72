"""Mixtral (Jiang et al., 2024): a Mistral decoder whose MLP is a sparse mixture of experts.

Each layer is Llama's pre-norm block (x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))) with the
MLP replaced by `SparseMoE`: a router picks 2 of 8 SwiGLU experts per token from the softmax over
all experts, renormalised over the two. Checkpoints name the block `block_sparse_moe` and the
experts' matrices w1/w3/w2 (gate/up/down); the safetensors source reads them, or transformers 5's
fused 3-D `gate_up_proj`/`down_proj`, under the canonical `mlp.gate`, `mlp.experts.E.*_proj`
names. The layer is shared with Qwen3-MoE (`qwen3_moe.py`), where some layers may stay dense.
"""

from __future__ import annotations

import torch
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.attention import AttentionMetadata, KVCache
from mohawk_shard.model.blocks import Attention, GatedMLP, RMSNorm, Take
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.stage import DecoderLayer, DecoderStage


class MoEDecoderLayer(nn.Module):
    """A pre-norm decoder layer whose MLP is routed experts (or dense where the config says)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: SparseMoE | GatedMLP = SparseMoE(config) if config.is_moe_layer(layer) else GatedMLP(config)

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the dense tensors; a matmul already swapped for a quantized layer is skipped."""
        self.input_layernorm.weight.copy_(take(prefix + "input_layernorm.weight"))
        self.post_attention_layernorm.weight.copy_(take(prefix + "post_attention_layernorm.weight"))
        self.self_attn.load_weights(take, prefix + "self_attn.")
        self.mlp.load_weights(take, prefix + "mlp.")

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), meta, cache)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class MixtralStage(DecoderStage):
    """Layers [start, end) of a Mixtral model, every expert of each layer included."""

    def make_layer(self, config: ModelConfig, layer: int) -> DecoderLayer:
        return MoEDecoderLayer(config, layer)
