"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM) for one contiguous layer range.

Touvron et al.'s pre-norm decoder: x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)), with rotary
positions, grouped-query attention and a SwiGLU MLP. Qwen2 adds biases to q/k/v; Qwen3 normalises
each head's queries and keys (RMSNorm over head_dim) before the rotation. A stage holds layers
[start, end): the first stage also embeds token ids, the last also applies the final norm and the
LM head. Tokens of all sequences in a step are flattened to [num_tokens, hidden]; only attention
sees the batch structure, through `AttentionMetadata`. q/k/v and gate/up are fused into one matmul.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.attention import AttentionMetadata, KVCache, paged_attention
from mohawk_shard.model.linear import Linear
from mohawk_shard.model.rope import apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self.shape = (dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), self.shape, self.weight.float(), self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

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
        q, k = apply_rotary(qk, meta.cos, meta.sin).split([self.num_heads, self.num_kv_heads], dim=1)
        return self.o_proj.forward(paged_attention(q, k, v, cache, meta))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def load_weights(self, take: Callable[[str], torch.Tensor], prefix: str) -> None:
        """Copy in the dense tensors; a matmul already swapped for a quantized layer is skipped."""
        attn, mlp = self.self_attn, self.mlp
        self.input_layernorm.weight.copy_(take(prefix + "input_layernorm.weight"))
        self.post_attention_layernorm.weight.copy_(take(prefix + "post_attention_layernorm.weight"))
        if isinstance(attn.qkv_proj, Linear):
            attn.qkv_proj.weight.copy_(torch.cat([take(f"{prefix}self_attn.{p}_proj.weight") for p in "qkv"]))
            if attn.qkv_proj.bias is not None:
                biases = [take(f"{prefix}self_attn.{p}_proj.bias") for p in "qkv"]
                attn.qkv_proj.bias.copy_(torch.cat(biases))
        if isinstance(attn.o_proj, Linear):
            attn.o_proj.weight.copy_(take(prefix + "self_attn.o_proj.weight"))
        if attn.q_norm is not None and attn.k_norm is not None:
            attn.q_norm.weight.copy_(take(prefix + "self_attn.q_norm.weight"))
            attn.k_norm.weight.copy_(take(prefix + "self_attn.k_norm.weight"))
        if isinstance(mlp.gate_up_proj, Linear):
            gate_up = (take(prefix + "mlp.gate_proj.weight"), take(prefix + "mlp.up_proj.weight"))
            mlp.gate_up_proj.weight.copy_(torch.cat(gate_up))
        if isinstance(mlp.down_proj, Linear):
            mlp.down_proj.weight.copy_(take(prefix + "mlp.down_proj.weight"))

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        # submodules' forward is called directly: nn.Module.__call__'s hook machinery costs about
        # as much as the small ops of a batch-1 step (measured: 2 ms of 9 over 30 layers)
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), meta, cache)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class LlamaStage(nn.Module):
    """Layers [start, end) of a Llama-family model, plus embedding and/or head where the stage has them."""

    def __init__(self, config: ModelConfig, start: int, end: int, *, embedding: bool, head: bool) -> None:
        super().__init__()
        self.config = config
        self.start, self.end = start, end
        self.embed_tokens: nn.Module | None = (
            nn.Embedding(config.vocab_size, config.hidden_size) if embedding else None
        )
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(start, end))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if head else None
        self.lm_head: nn.Module | None = (
            Linear(config.hidden_size, config.vocab_size, bias=False) if head else None
        )
        self.tie_weights()
        self.requires_grad_(False)
        self._embeds = embedding

    def tie_weights(self) -> None:
        """Share one matrix between embedding and LM head when the model ties them and the stage has both."""
        if self._holds_tied_pair():
            self.lm_head.weight = cast(nn.Parameter, self.embed_tokens.weight)  # type: ignore[union-attr]

    def _holds_tied_pair(self) -> bool:
        """Both ends of a tied embedding, both dense (a quantized end keeps its own copy)."""
        return (
            self.config.tie_word_embeddings
            and isinstance(self.lm_head, Linear)
            and isinstance(self.embed_tokens, nn.Embedding)
        )

    @property
    def has_embedding(self) -> bool:
        return self._embeds

    def store_linear_weights_transposed(self) -> None:
        """Switch every matmul to the transposed weight layout (fp32 on CPU, see `linear.py`).

        A tied LM head keeps one matrix: the embedding then looks token rows up as its columns.
        """
        tied = self._holds_tied_pair()
        for module in self.modules():
            if isinstance(module, Linear):
                module.store_transposed()
        if tied:
            self.embed_tokens = None

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(token_ids)
        if not isinstance(self.lm_head, Linear) or not self._embeds:
            raise RuntimeError("this stage does not hold the embedding")
        return self.lm_head.weight.index_select(1, token_ids).t().contiguous()

    @property
    def has_head(self) -> bool:
        return self.lm_head is not None

    def forward(
        self,
        inputs: torch.Tensor,
        meta: AttentionMetadata,
        caches: list[KVCache],
        logits_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token ids [T] (first stage) or hidden states [T, hidden] -> hidden states or logits."""
        x = self.embed(inputs) if self._embeds else inputs
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer.forward(x, meta, cache)
        if self.norm is None or self.lm_head is None:
            return x
        if logits_rows is not None:
            x = x.index_select(0, logits_rows)
        return self.lm_head.forward(self.norm.forward(x)).float()

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy canonical-name arrays from the model store in, fusing q/k/v and gate/up."""

        def take(name: str) -> torch.Tensor:
            return torch.from_numpy(weights[name])

        with torch.no_grad():
            if isinstance(self.embed_tokens, nn.Embedding):
                self.embed_tokens.weight.copy_(take("embed_tokens.weight"))
            for offset, layer in enumerate(self.layers):
                cast(DecoderLayer, layer).load_weights(take, f"layers.{self.start + offset}.")
            if self.norm is not None and self.lm_head is not None:
                self.norm.weight.copy_(take("norm.weight"))
                if isinstance(self.lm_head, Linear) and not self._holds_tied_pair():
                    self.lm_head.weight.copy_(take("lm_head.weight"))
