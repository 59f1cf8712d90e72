"""A batch-1 decode step replayed from a TorchScript trace: eager's own kernels, without Python between them.

Design. On CPU a batch-1 decode step of a small model is a few hundred small ops (norms, rotary,
fixed-chunk attention, casts around each 4-bit matmul) whose Python dispatch costs about as much as
their arithmetic. `torch.jit.trace` records the stage's own `forward` once and replays the recorded
ATen calls from C++: the same kernels in the same order on the same shapes, so the numbers are bit
for bit eager's. (Inductor compiles faster code but changes the arithmetic, fusing reductions and
elementwise ops: a whole step compiled with freezing came out up to 1.6 apart in the logits, which
would break batch invariance.) A trace holds what was a Python value when it was recorded, so what
varies from step to step comes in as a trace input: the token id (or hidden state), the rotary rows,
the slot written, the context's slots and the attention mask, and the caches' K/V tensors (a tensor
a trace merely closes over would be baked in as a copy). The context length is baked in, so steps
are bucketed: the context is padded to the next power of two of at least `CHUNK` keys with masked
keys, which fixed-chunk attention adds as exact zeros (`fixed_chunk_attention.py`), so a bucket's
padding changes no bit and a few traces cover every length. A bucket is traced only after it has
served `trace_after` eager steps (tracing takes seconds; short generations never pay it), and each
trace is checked once on the step it was recorded from: bit-equal to eager, or the bucket stays
eager for good. On CUDA the same step, with the same inputs, is recorded as a CUDA graph instead
(`cuda_graph_step.py`): there the host's launches, not Python's dispatch, are what a small step
waits on, and a graph replays them all in one call. Only stages whose forward has no data-dependent
Python take this path: batch invariant attention, one KV group without a window, no int8 tier, no
routed experts, on CPU or CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch
from torch import nn

from mohawk_shard.model.attention_metadata import AttentionMetadata, AttentionPart, GroupStep
from mohawk_shard.model.cuda_graph_step import CudaGraphStep
from mohawk_shard.model.fixed_chunk_attention import CHUNK
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import KVCache
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.rope import RotaryTable

if TYPE_CHECKING:
    from mohawk_shard.model.cuda_graph_step import GraphPool

log = structlog.get_logger("mohawk.shard.model")

TRACE_AFTER = 32  # eager batch-1 steps of a bucket before it is traced

Replay = Callable[..., torch.Tensor]  # a bucket's recorded step: a TorchScript trace or a CUDA graph


def context_bucket(context_len: int) -> int:
    """Keys a step of `context_len` is padded to: the next power of two, at least `CHUNK`."""
    return max(CHUNK, 1 << (context_len - 1).bit_length())


def traceable(
    model: nn.Module, rotary: RotaryTable, device: torch.device, windows: Mapping[int, int | None]
) -> bool:
    """Whether the stage's forward runs the same Python for every batch-1 decode (no routed
    experts, one KV group without a window, one rotary base) on CPU or CUDA."""
    if device.type not in ("cpu", "cuda") or list(windows.values()) != [None] or rotary.local is not None:
        return False
    return not any(isinstance(module, SparseMoE) for module in model.modules())


class _DecodeStep(nn.Module):
    """The stage's forward for one decode token, metadata rebuilt from tensors given as inputs."""

    def __init__(self, model: nn.Module, bucket: int) -> None:
        super().__init__()
        self.model, self.bucket = model, bucket

    def forward(
        self,
        inputs: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot: torch.Tensor,
        context_slots: torch.Tensor,
        mask: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        lengths = np.array([self.bucket])
        part = AttentionPart(
            1, 1, False, context_slots=context_slots, query_lens=np.ones(1, np.int64), context_lens=lengths
        )
        part.fixed_masks["fixedNone"] = (mask, lengths)  # what `fixed_chunk_mask` would build
        meta = AttentionMetadata(cos, sin, {0: GroupStep(slot, [part])}, None, fixed_chunks=True)
        caches = [KVCache(k, v) for k, v in zip(keys, values, strict=True)]
        return self.model(inputs, meta, caches, None)


class TracedDecode:
    """Batch-1 decode steps of one stage, by context bucket: eager until traced, then the trace."""

    def __init__(self, model: nn.Module, rotary: RotaryTable, trace_after: int = TRACE_AFTER) -> None:
        self.model, self.rotary, self.trace_after = model, rotary, trace_after
        self._traces: dict[int, Replay | None] = {}
        self._eager_steps: dict[int, int] = {}
        self._graph_pool: GraphPool | None = None  # the CUDA graphs' shared memory pool

    @staticmethod
    def applies(batch: ForwardBatch) -> bool:
        """One sequence decoding one token after at least one before it, its logits wanted."""
        one = batch.num_seqs == 1 and batch.num_tokens == 1 and batch.logits_rows.shape[0] == 1
        return one and int(batch.context_lens[0]) > 1

    def forget(self) -> None:
        """Drop every trace (they hold the caches' shapes, a graph their addresses: called when the
        caches are reallocated)."""
        self._traces.clear()
        self._eager_steps.clear()
        self._graph_pool = None

    def step(
        self,
        batch: ForwardBatch,
        inputs: torch.Tensor,
        caches: list[KVCache],
        eager: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """The step's output: from the bucket's trace, or from `eager()` (tracing the bucket once
        it has run `trace_after` eager steps)."""
        context_len = int(batch.context_lens[0])
        bucket = context_bucket(context_len)
        if bucket in self._traces:
            trace = self._traces[bucket]
            return eager() if trace is None else trace(*self._trace_inputs(batch, inputs, caches, bucket))
        out = eager()
        seen = self._eager_steps[bucket] = self._eager_steps.get(bucket, 0) + 1
        if seen >= self.trace_after:
            self._traces[bucket] = self._trace(batch, inputs, caches, bucket, out)
        return out

    def _trace_inputs(
        self, batch: ForwardBatch, inputs: torch.Tensor, caches: list[KVCache], bucket: int
    ) -> tuple[object, ...]:
        context_len = int(batch.context_lens[0])
        device = inputs.device
        positions = torch.from_numpy(batch.positions).to(device)
        cos, sin = self.rotary.lookup(positions)
        slot = torch.from_numpy(batch.slot_mapping).to(device)
        slots = batch.context_slots()[0]
        padded = np.full(bucket, slots[-1], dtype=np.int64)  # masked keys: any slot of the context
        padded[:context_len] = slots
        mask = torch.zeros(1, 1, bucket, device=device)
        mask[..., context_len:] = float("-inf")
        keys = [c.key for c in caches]
        values = [c.value for c in caches]
        return inputs, cos, sin, slot, torch.from_numpy(padded).to(device), mask, keys, values

    def _trace(
        self,
        batch: ForwardBatch,
        inputs: torch.Tensor,
        caches: list[KVCache],
        bucket: int,
        eager_out: torch.Tensor,
    ) -> Replay | None:
        """The bucket's trace (a CUDA graph on a GPU), recorded on this step (whose K/V it writes
        again, the same values) and kept only if it gives eager's output bit for bit."""
        args = self._trace_inputs(batch, inputs, caches, bucket)
        step = _DecodeStep(self.model, bucket).eval()
        try:
            replay = self._record(step, args)
        except RuntimeError as error:  # a capture that met an op a graph cannot hold
            log.warning("decode step not recorded: the bucket stays eager", bucket=bucket, error=error)
            return None
        if not torch.equal(replay(*args), eager_out):
            log.warning("decode trace differs from eager: the bucket stays eager", context_bucket=bucket)
            return None
        return replay

    def _record(self, step: _DecodeStep, args: Sequence[object]) -> Replay:
        if isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            return CudaGraphStep(step, args, self._graph_pool)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it bakes in
            return torch.jit.trace(step, tuple(args), check_trace=False)
