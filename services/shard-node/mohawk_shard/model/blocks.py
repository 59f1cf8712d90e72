"""The layers decoder architectures share: RMSNorm, attention over the paged KV cache, gated MLP.

A model file (`models/<arch>.py`) wires these into its decoder layer; what differs between
architectures is given by the `ModelConfig` (q/k norms, biases, partial rotary, the attention
scale, sliding windows, soft-capping, the MLP's activation) or by the norm class passed in
(Gemma's `OffsetRMSNorm`). q/k/v and gate/up are fused into one matmul each, under the module
paths `weight_formats.LAYER_MATMULS` names, so the loader can swap any of them for a 4-bit layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.kernels import rms_norm_rows
from mohawk_shard.model.attention import AttentionMetadata, AttentionOptions, paged_attention
from mohawk_shard.model.kv_cache import KVCache
from mohawk_shard.model.linear import Linear
from mohawk_shard.model.rope import apply_rotary

Take = Callable[[str], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self.shape = (dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rms_norm_rows.supports(x, self.weight):  # one compiled call, not six ops
            return rms_norm_rows.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), self.shape, self.weight.float(), self.eps).to(x.dtype)


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the checkpoint stores w and the norm scales by (1 + w), computed in fp32;
    fp32 rows on CPU take the compiled kernel: 108 of these a Gemma 3 270M decode step, 44 µs each
    as torch ops. (1 + w is one add a call: a kept copy would need the weight's version counter,
    which a tensor made under inference mode does not have.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight.float() + 1.0
        if x.dtype == torch.float32 and rms_norm_rows.supports(x, scale):
            return rms_norm_rows.rms_norm(x, scale, self.eps)
        return F.rms_norm(x.float(), self.shape, scale, self.eps).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention of decoder layer `layer`, rotary on the first `rotary_dim` dims of q and k."""

    def __init__(self, config: ModelConfig, layer: int, norm: type[RMSNorm] = RMSNorm) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = norm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = norm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        scalar = config.query_pre_attn_scalar
        window = config.layer_window(layer)
        self.options = AttentionOptions(
            scale=None if scalar is None else float(scalar) ** -0.5,
            window=window,
            softcap=config.attn_logit_softcapping,
        )
        # with two rotary bases (Gemma 3), sliding layers turn by the local one
        self.local_rotary = window is not None and config.rope_local_theta is not None

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        qkv = self.qkv_proj.forward(x)
        heads = self.num_heads + self.num_kv_heads
        v = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k, _ = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self.q_norm(q.view(-1, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(-1, self.num_kv_heads, self.head_dim))
            qk = torch.cat((q, k), dim=1)
        else:
            qk = qkv[:, : self.q_size + self.kv_size].view(-1, heads, self.head_dim)
        cos, sin = meta.cos, meta.sin
        if self.local_rotary and meta.local_rotary is not None:
            cos, sin = meta.local_rotary
        q, k = apply_rotary(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        return self.o_proj.forward(paged_attention(q, k, v, cache, meta, self.options))

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the dense tensors under `prefix` (`layers.N.self_attn.`); a quantized matmul is skipped."""
        if isinstance(self.qkv_proj, Linear):
            self.qkv_proj.weight.copy_(torch.cat([take(f"{prefix}{p}_proj.weight") for p in "qkv"]))
            if self.qkv_proj.bias is not None:
                self.qkv_proj.bias.copy_(torch.cat([take(f"{prefix}{p}_proj.bias") for p in "qkv"]))
        if isinstance(self.o_proj, Linear):
            self.o_proj.weight.copy_(take(prefix + "o_proj.weight"))
        if self.q_norm is not None and self.k_norm is not None:
            self.q_norm.weight.copy_(take(prefix + "q_norm.weight"))
            self.k_norm.weight.copy_(take(prefix + "k_norm.weight"))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu_tanh": _gelu_tanh}


class GatedMLP(nn.Module):
    """down(act(gate(x)) · up(x)): SwiGLU with SiLU (Llama, Phi-3, each MoE expert), GeGLU with
    tanh-GELU (Gemma). `intermediate_size` defaults to the config's (a MoE expert's is its own)."""

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        inter = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * inter, bias=False)
        self.down_proj = Linear(inter, config.hidden_size, bias=False)
        self.act = _ACTIVATIONS[config.hidden_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(self.act(gate) * up)

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the dense tensors under `prefix` (`layers.N.mlp.`); a quantized matmul is skipped."""
        if isinstance(self.gate_up_proj, Linear):
            gate_up = (take(prefix + "gate_proj.weight"), take(prefix + "up_proj.weight"))
            self.gate_up_proj.weight.copy_(torch.cat(gate_up))
        if isinstance(self.down_proj, Linear):
            self.down_proj.weight.copy_(take(prefix + "down_proj.weight"))
