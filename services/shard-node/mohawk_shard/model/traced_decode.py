"""A batch-1 decode step replayed from a TorchScript trace: eager's own kernels, without Python between
them.

Design. On CPU a batch-1 decode step of a small model is a few hundred small ops (norms, rotary,
fixed-chunk attention, casts around each 4-bit matmul) whose Python dispatch costs about as much as
their arithmetic. `torch.jit.trace` records the stage's own `forward` once and replays the recorded
ATen calls from C++: the same kernels in the same order on the same shapes, so the numbers are bit
for bit eager's. (Inductor compiles faster code but changes the arithmetic, fusing reductions and
elementwise ops: a whole step compiled with freezing came out up to 1.6 apart in the logits, which
would break batch invariance.) A trace holds what was a Python value when it was recorded, so what
varies from step to step comes in as a trace input: the token id (or hidden state), the rotary rows,
the slot written, the context's slots and the attention mask, and the caches' K/V tensors (a tensor
a trace merely closes over is baked in for good, and caches are reallocated). The weights are closed
over: the step is traced as a function, which keeps them as constants (the same tensors), instead of
as a module, whose tracing first turns every submodule into a script module. The context length is
baked in, so steps are bucketed: the context is padded to the next power of two of at least `CHUNK`
keys with masked keys, which fixed-chunk attention adds as exact zeros (`fixed_chunk_attention.py`),
so a bucket's padding changes no bit and a few traces cover every length. A bucket is traced only
after it has served `trace_after` eager steps (tracing takes 0.2-0.3 s for Gemma 3 270M's step,
about 50 steps' worth of what a trace saves; very short generations never pay it), and each trace is
checked once on the step it was recorded from: bit-equal to eager, or the bucket stays eager for
good. The trace is replayed without TorchScript's optimizing passes (`_unoptimized`). A model with
sliding-window layers (Gemma 2 and 3) has several KV groups (`mohawk_common.kv_groups`), each with
its own slots, context and mask as trace inputs; a sliding group reads from the first chunk its
window still holds, so its context never passes the window plus a chunk, and its bucket is capped
there (`group_bucket`): a long answer still needs only a few traces, keyed by every group's bucket.
Sliding layers' own rotary base comes in as two more inputs. On CUDA the same step, with the same
inputs, is recorded as a CUDA graph instead (`cuda_graph_step.py`): there the host's launches, not
Python's dispatch, are what a small step waits on, and a graph replays them all in one call. Only
stages whose forward has no data-dependent Python take this path: batch invariant attention, no int8
tier, no routed experts, on CPU or CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch
from torch import nn

from mohawk_shard.model.attention_metadata import (
    AttentionMetadata,
    AttentionPart,
    GroupStep,
    additive_mask,
    group_view,
    window_align,
)
from mohawk_shard.model.cuda_graph_step import CudaGraphStep
from mohawk_shard.model.fixed_chunk_attention import CHUNK, allowed_keys, padded_length
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import KVCache
from mohawk_shard.model.moe import SparseMoE
from mohawk_shard.model.rope import RotaryTable

if TYPE_CHECKING:
    from mohawk_shard.model.cuda_graph_step import GraphPool

log = structlog.get_logger("mohawk.shard.model")

TRACE_AFTER = 16  # eager batch-1 steps of a bucket before it is traced

Replay = Callable[..., torch.Tensor]  # a bucket's recorded step: a TorchScript trace or a CUDA graph
Tensors = list[torch.Tensor]
# a step's trace inputs: hidden state or token, rotary rows, per group slot, context and mask, K, V
TraceInputs = tuple[torch.Tensor, Tensors, Tensors, Tensors, Tensors, Tensors, Tensors]


def context_bucket(context_len: int) -> int:
    """Keys a step of `context_len` is padded to: the next power of two, at least `CHUNK`."""
    return max(CHUNK, 1 << (context_len - 1).bit_length())


def group_bucket(context_len: int, window: int | None) -> int:
    """Keys a group's step is padded to: `context_bucket`, capped for a sliding group at the most
    context it ever reads (its window plus the chunk its start is rounded down by)."""
    bucket = context_bucket(context_len)
    return bucket if window is None else min(bucket, padded_length(window + CHUNK - 1))


def traceable(model: nn.Module, device: torch.device) -> bool:
    """Whether the stage's forward runs the same Python for every batch-1 decode (no routed
    experts) on CPU or CUDA."""
    if device.type not in ("cpu", "cuda"):
        return False
    return not any(isinstance(module, SparseMoE) for module in model.modules())


class _DecodeStep(nn.Module):
    """The stage's forward for one decode token, metadata rebuilt from tensors given as inputs:
    per KV group (`windows`, in order) its slot, padded context and mask; `groups[i]` is the KV
    group of the stage's cache `i`."""

    def __init__(
        self,
        model: nn.Module,
        windows: Mapping[int, int | None],
        buckets: Sequence[int],
        groups: Sequence[int],
    ) -> None:
        super().__init__()
        self.model, self.windows, self.buckets, self.groups = (
            model,
            dict(windows),
            list(buckets),
            list(groups),
        )

    def forward(
        self,
        inputs: torch.Tensor,
        rotary: list[torch.Tensor],
        slots: list[torch.Tensor],
        contexts: list[torch.Tensor],
        masks: list[torch.Tensor],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        steps = {}
        for (group, window), bucket, slot, context, mask in zip(
            self.windows.items(), self.buckets, slots, contexts, masks, strict=True
        ):
            lengths = np.array([bucket])
            part = AttentionPart(
                1, 1, False, context_slots=context, query_lens=np.ones(1, np.int64), context_lens=lengths
            )
            part.fixed_masks[f"fixed{window}"] = (mask, lengths)  # what `fixed_chunk_mask` would build
            steps[group] = GroupStep(slot, [part])
        local = (rotary[2], rotary[3]) if len(rotary) == 4 else None
        meta = AttentionMetadata(rotary[0], rotary[1], steps, local, fixed_chunks=True)
        caches = [KVCache(k, v, group=g) for k, v, g in zip(keys, values, self.groups, strict=True)]
        return self.model(inputs, meta, caches, None)


class TracedDecode:
    """Batch-1 decode steps of one stage, by context bucket: eager until traced, then the trace."""

    def __init__(
        self,
        model: nn.Module,
        rotary: RotaryTable,
        trace_after: int = TRACE_AFTER,
        windows: Mapping[int, int | None] | None = None,
    ) -> None:
        """`windows`: the stage's KV groups and their windows (default one full-attention group 0)."""
        self.model, self.rotary, self.trace_after = model, rotary, trace_after
        self.windows = dict(windows or {0: None})
        self._traces: dict[tuple[int, ...], Replay | None] = {}  # by each group's bucket
        self._eager_steps: dict[tuple[int, ...], int] = {}
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
        align = window_align(batch.block_size, fixed_chunks=True)
        views = [group_view(batch, group, window, align) for group, window in self.windows.items()]
        bucket = tuple(
            group_bucket(int(view.context_lens[0]), w)
            for view, w in zip(views, self.windows.values(), strict=True)
        )
        if bucket in self._traces:
            trace = self._traces[bucket]
            if trace is None:
                return eager()
            return trace(*self._trace_inputs(batch, views, inputs, caches, bucket))
        out = eager()
        seen = self._eager_steps[bucket] = self._eager_steps.get(bucket, 0) + 1
        if seen >= self.trace_after:
            self._traces[bucket] = self._trace(batch, views, inputs, caches, bucket, out)
        return out

    def _trace_inputs(
        self,
        batch: ForwardBatch,
        views: Sequence[ForwardBatch],
        inputs: torch.Tensor,
        caches: list[KVCache],
        buckets: Sequence[int],
    ) -> TraceInputs:
        """The trace's arguments; `views`: the step as each KV group reads it (`group_view`)."""
        device = inputs.device
        positions = torch.from_numpy(batch.positions).to(device)
        rotary = list(self.rotary.lookup(positions))
        rotary += self.rotary.lookup_local(positions) or ()
        slots, contexts, masks = [], [], []
        for view, window, bucket in zip(views, self.windows.values(), buckets, strict=True):
            context_len = int(view.context_lens[0])
            context = view.context_slots()[0]
            padded = np.full(bucket, context[-1], dtype=np.int64)  # masked keys: any slot of the context
            padded[:context_len] = context
            allowed = allowed_keys(np.ones(1, np.int64), view.context_lens, window, bucket)
            slots.append(torch.from_numpy(view.slot_mapping).to(device))
            contexts.append(torch.from_numpy(padded).to(device))
            masks.append(additive_mask(torch.from_numpy(allowed).to(device), torch.float32))
        keys = [c.key for c in caches]
        values = [c.value for c in caches]
        return inputs, rotary, slots, contexts, masks, keys, values

    def _trace(
        self,
        batch: ForwardBatch,
        views: Sequence[ForwardBatch],
        inputs: torch.Tensor,
        caches: list[KVCache],
        bucket: tuple[int, ...],
        eager_out: torch.Tensor,
    ) -> Replay | None:
        """The bucket's trace (a CUDA graph on a GPU), recorded on this step (whose K/V it writes
        again, the same values) and kept only if it gives eager's output bit for bit."""
        args = self._trace_inputs(batch, views, inputs, caches, bucket)
        step = _DecodeStep(self.model, self.windows, bucket, [c.group for c in caches]).eval()
        try:
            replay = self._record(step, args)
        except RuntimeError as error:  # a capture that met an op a graph cannot hold
            log.warning("decode step not recorded: the bucket stays eager", bucket=bucket, error=error)
            return None
        if not torch.equal(replay(*args), eager_out):
            log.warning("decode trace differs from eager: the bucket stays eager", context_buckets=bucket)
            return None
        return replay

    def _record(self, step: _DecodeStep, args: Sequence[object]) -> Replay:
        if isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            return CudaGraphStep(step, args, self._graph_pool)
        # A function, not the module: tracing a module first makes a script module of every
        # submodule (half of the 0.43-0.51 s Gemma 3 270M's step took to record; 0.21-0.24 s as a
        # function, scratch timer). A function's trace keeps the weights it read as constants:
        # the same tensors, not copies (none requires grad).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it bakes in
            trace = torch.jit.trace(lambda *inputs: step(*inputs), tuple(args), check_trace=False)
        return _unoptimized(trace)


def _unoptimized(trace: Replay) -> Replay:
    """`trace` replayed without the graph executor's optimizing passes: they profile the first two
    replays (0.6-0.8 s each for Gemma 3 270M's step, 26 ms after) and made steps no faster (a scratch
    A/B, interleaved processes: 27-32 against 29-35 tok/s steady)."""

    def replay(*args: object) -> torch.Tensor:
        with torch.jit.optimized_execution(False):
            return trace(*args)

    return replay
