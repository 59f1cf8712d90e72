"""Mixtral (Jiang et al., 2024): a Mistral decoder whose MLP is a sparse mixture of experts.

Each layer is Llama's pre-norm block (x += Attn(RMSNorm(x)); x += MoE(RMSNorm(x))) with the
MLP replaced by `SparseMoE`: a router picks 2 of 8 SwiGLU experts per token from the softmax over
all experts, renormalised over the two. Checkpoints name the block `block_sparse_moe` and the
experts' matrices w1/w3/w2 (gate/up/down); the safetensors source reads them, or transformers 5's
fused 3-D `gate_up_proj`/`down_proj`, under the canonical `mlp.gate`, `mlp.experts.E.*_proj`
names. The layer is shared with Qwen3-MoE (`qwen3_moe.py`), where some layers may stay dense.
"""

from __future__ import annotations

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.blocks import GatedMLP
from mohawk_shard.model.models.llama import LlamaDecoderLayer
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.stage import DecoderLayer, DecoderStage


class MoEDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm decoder layer whose MLP is routed experts (or dense where the config says)."""

    def make_mlp(self, config: ModelConfig, layer: int) -> GatedMLP | SparseMoE:
        return SparseMoE(config) if config.is_moe_layer(layer) else GatedMLP(config)


class MixtralStage(DecoderStage):
    """Layers [start, end) of a Mixtral model, every expert of each layer included."""

    def make_layer(self, config: ModelConfig, layer: int) -> DecoderLayer:
        return MoEDecoderLayer(config, layer)
