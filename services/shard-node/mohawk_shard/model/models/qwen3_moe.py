"""Qwen3-MoE (Qwen Team, 2025): the Qwen3 decoder with a sparse mixture-of-experts MLP.

Attention is Qwen3's (RMSNorm over each head's queries and keys before the rotation, from the
config's `qk_norm`); the MLP is `SparseMoE` with many small experts (128, 8 a token, in the
released models). The softmax over all experts is renormalised over the top k only when the
config's `norm_topk_prob` says so. Layers listed in `mlp_only_layers`, or off the
`decoder_sparse_step` grid, keep a dense SwiGLU MLP of `intermediate_size` (`dense_mlp_layers`).
Checkpoints store experts per expert (`mlp.experts.E.gate_proj`) or, saved by transformers 5
without conversion, fused 3-D; the safetensors source reads both.
"""

from __future__ import annotations

from mohawk_shard.model.models.mixtral import MixtralStage


class Qwen3MoEStage(MixtralStage):
    """Layers [start, end) of a Qwen3-MoE model."""
