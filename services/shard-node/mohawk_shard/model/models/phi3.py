"""Phi-3 and Phi-4 (Abdin et al.): a Llama decoder whose checkpoints fuse q/k/v and gate/up.

The layer is Llama's (pre-norm, grouped-query attention, SwiGLU); what is Phi's lies elsewhere:
the sources split the checkpoint's `qkv_proj`/`gate_up_proj` (GGUF `attn_qkv`/`ffn_up`) into the
canonical q/k/v and gate/up tensors at read time (`source.fused_part`), so the loader and the
4-bit paths are the same as Llama's; partial rotary (`partial_rotary_factor`, Phi-4-mini) and the
sliding window (Phi-3-mini-4k) come from the config; LongRoPE runs with its short factors and the
context capped at the pretraining length, where transformers uses them too (`config.read_rope`).
"""

from __future__ import annotations

from mohawk_shard.model.models.llama import LlamaStage


class Phi3Stage(LlamaStage):
    """Layers [start, end) of a Phi-3/Phi-4 model."""
