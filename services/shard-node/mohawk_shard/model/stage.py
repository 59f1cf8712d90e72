"""`DecoderStage`: one contiguous layer range of a decoder, whatever its architecture.

A stage holds layers [start, end): the first stage also embeds token ids, the last also applies
the final norm and the LM head. Tokens of all sequences in a step are flattened to [num_tokens,
hidden]; only attention sees the batch structure, through `AttentionMetadata`. A model file
subclasses this with its decoder layer (`make_layer`), its norm class, and, where the architecture
has them, an embedding scale and a final logit soft-cap; the rest (tying, the transposed weight
layout, loading) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol, cast

import numpy as np
import torch
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.attention import AttentionMetadata
from mohawk_shard.model.blocks import RMSNorm, Take
from mohawk_shard.model.kv_cache import KVCache
from mohawk_shard.model.linear import Linear


class DecoderLayer(Protocol):
    def forward(self, x: torch.Tensor, meta: AttentionMetadata, cache: KVCache) -> torch.Tensor: ...

    def load_weights(self, take: Take, prefix: str) -> None: ...


class DecoderStage(nn.Module):
    """Layers [start, end) of a decoder, plus embedding and/or head where the stage has them."""

    norm_class: ClassVar[type[RMSNorm]] = RMSNorm

    def __init__(self, config: ModelConfig, start: int, end: int, *, embedding: bool, head: bool) -> None:
        super().__init__()
        self.config = config
        self.start, self.end = start, end
        # given its weight, nn.Embedding skips its random init (on the meta device, normal_ imports
        # torch._dynamo: 1.7 s of a process's start)
        table = torch.empty(config.vocab_size, config.hidden_size) if embedding else None
        self.embed_tokens: nn.Module | None = (
            nn.Embedding(config.vocab_size, config.hidden_size, _weight=table) if embedding else None
        )
        self.layers = nn.ModuleList(cast(nn.Module, self.make_layer(config, i)) for i in range(start, end))
        self.norm = self.norm_class(config.hidden_size, config.rms_norm_eps) if head else None
        self.lm_head: nn.Module | None = (
            Linear(config.hidden_size, config.vocab_size, bias=False) if head else None
        )
        self.tie_weights()
        self.requires_grad_(False)
        self._embeds = embedding

    def make_layer(self, config: ModelConfig, layer: int) -> DecoderLayer:
        """Decoder layer number `layer` of the model."""
        raise NotImplementedError

    @property
    def embed_scale(self) -> float | None:
        """What token embeddings are multiplied by (Gemma: sqrt(hidden)); None: nothing."""
        return None

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
            x = self.embed_tokens(token_ids)
        elif not isinstance(self.lm_head, Linear) or not self._embeds:
            raise RuntimeError("this stage does not hold the embedding")
        else:
            x = self.lm_head.weight.index_select(1, token_ids).t().contiguous()
        scale = self.embed_scale
        return x if scale is None else x * torch.tensor(scale, dtype=x.dtype)

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
        logits = self.lm_head.forward(self.norm.forward(x)).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

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
