"""`SparseMoE`: a mixture-of-experts MLP (Mixtral, Qwen3-MoE), every expert held by the stage.

Design. A router (one [experts, hidden] matmul) scores each token; the softmax over all experts
is taken in fp32, the top k kept, and, where the model renormalises (Mixtral always, Qwen3-MoE
when `norm_topk_prob`), divided by their sum. Each token's output is the weighted sum of its k
experts' SwiGLU MLPs. Rather than a Python loop over tokens, the (token, expert) pairs are sorted
by expert once and every pair's row picked at once (`index_select`): each expert then runs one
batched SwiGLU over its run of rows, and the outputs, scaled by their routing weights, are put
back in (token, expert) order and summed in k adds, each token's experts in ascending order: the
same bits whatever else the step holds, and no add whose indices repeat (CUDA's `index_add_`
would sum a token's k outputs by atomics, in no fixed order). The loop is over the experts a step
routes to (at most `num_experts`, usually all of them in a prefill, k of them at batch 1); one
host sync reads the per-expert counts. Each expert is a `GatedMLP` under `experts.E` with its
gate and up fused (`gate_up_proj`) and its `down_proj`, the module paths
`weight_formats.layer_matmuls` names, so the loader holds an expert's matmuls as it holds a dense
layer's: a GGUF's Q4_K experts as `Int4Linear`s over the file's codes, Q6_K/Q8_0 ones as
`GroupwiseLinear`s, each expert built from its own rows of the file's 3-D tensor (no expert is
ever dequantized), float ones dense in the compute dtype. The router stays dense (a few rows).
Routing never leaves the stage: a stage holds all experts of its layers.
"""

from __future__ import annotations

import torch
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.blocks import GatedMLP, Take
from mohawk_shard.model.linear import Linear


class SparseMoE(nn.Module):
    """Router, top-k and `num_experts` SwiGLU experts of one decoder layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden = config.num_experts, config.hidden_size
        self.num_experts, self.top_k = experts, config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.gate = Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(config, config.moe_intermediate_size) for _ in range(experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's k experts [T, k] and their weights [T, k] (fp32)."""
        probs = torch.softmax(self.gate.forward(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        experts, rank = experts.sort(dim=-1)  # each token's experts in ascending order
        weights = weights.gather(-1, rank)
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        tokens = order // self.top_k  # the token of each (token, expert) pair, grouped by expert
        scales = weights.flatten()[order].to(x.dtype).unsqueeze(1)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        picked = x.index_select(0, tokens)  # every pair's row, each expert's rows together
        outputs = torch.empty_like(picked)
        start = 0
        for mlp, count in zip(self.experts, counts, strict=True):
            if count:
                outputs[start : start + count] = mlp.forward(picked[start : start + count])
                start += count
        by_token = torch.empty_like(outputs)
        by_token[order] = outputs * scales  # back in (token, k-th expert) order: no index repeats
        by_token = by_token.view(-1, self.top_k, x.shape[-1])
        out = torch.zeros_like(x)
        for k in range(self.top_k):
            out += by_token[:, k]
        return out

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the router and every dense expert matmul under `prefix` (`layers.N.mlp.`); an
        expert matmul already swapped for a quantized layer is skipped."""
        self.gate.weight.copy_(take(prefix + "gate.weight"))
        for expert in range(self.num_experts):
            mlp: GatedMLP = self.experts[expert]  # type: ignore[assignment]
            mlp.load_weights(take, f"{prefix}experts.{expert}.")
