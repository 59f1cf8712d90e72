"""`SparseMoE`: a mixture-of-experts MLP (Mixtral, Qwen3-MoE), every expert held by the stage.

Design. A router (one [experts, hidden] matmul) scores each token; the softmax over all experts
is taken in fp32, the top k kept, and, where the model renormalises (Mixtral always, Qwen3-MoE
when `norm_topk_prob`), divided by their sum. Each token's output is the weighted sum of its k
experts' SwiGLU MLPs. Rather than a Python loop over tokens, the (token, expert) pairs are sorted
by expert once: each expert then runs one batched SwiGLU over the rows it was picked for
(`index_select`), scaled by their routing weights and scattered back with `index_add_`. The loop
is over the experts a step routes to (at most `num_experts`, usually all of them in a prefill,
k of them at batch 1); one host sync reads the per-expert counts. Experts are held as two 3-D
tensors, gate and up fused ([experts, 2 * inter, hidden]) and down ([experts, hidden, inter]),
dense in the compute dtype: the 4-bit paths (`weight_formats.py`) do not swap them, so a GGUF's
4-bit experts are dequantized at load (`weight_loading.py` logs it). Routing never leaves the
stage: a stage holds all experts of its layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mohawk_common.model_store import ModelConfig
from mohawk_shard.model.blocks import Take
from mohawk_shard.model.linear import Linear


class SparseMoE(nn.Module):
    """Router, top-k and `num_experts` SwiGLU experts of one decoder layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden, inter = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.top_k = experts, config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.inter = inter
        self.gate = Linear(hidden, experts, bias=False)
        self.gate_up = nn.Parameter(torch.empty(experts, 2 * inter, hidden), requires_grad=False)
        self.down = nn.Parameter(torch.empty(experts, hidden, inter), requires_grad=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's k experts [T, k] and their weights [T, k] (fp32)."""
        probs = torch.softmax(self.gate.forward(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        tokens = order // self.top_k  # the token of each (token, expert) pair, grouped by expert
        scales = weights.flatten()[order].to(x.dtype).unsqueeze(1)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = tokens[start : start + count]
            gate, up = F.linear(x.index_select(0, rows), self.gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down[expert])
            out.index_add_(0, rows, y * scales[start : start + count])
            start += count
        return out

    def load_weights(self, take: Take, prefix: str) -> None:
        """Copy in the router and every expert under `prefix` (`layers.N.mlp.`)."""
        self.gate.weight.copy_(take(prefix + "gate.weight"))
        for expert in range(self.num_experts):
            name = f"{prefix}experts.{expert}."
            self.gate_up[expert, : self.inter].copy_(take(name + "gate_proj.weight"))
            self.gate_up[expert, self.inter :].copy_(take(name + "up_proj.weight"))
            self.down[expert].copy_(take(name + "down_proj.weight"))
