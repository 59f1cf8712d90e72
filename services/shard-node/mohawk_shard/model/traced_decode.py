"""Decode steps replayed from a TorchScript trace (CPU, batch 1) or a CUDA graph (CUDA, 1 to 64
sequences): eager's own kernels, without Python between them.

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
Python's dispatch, are what a small step waits on, and a graph replays them all in one call. On
CUDA, steps of several decoding sequences are recorded as well, keyed by batch size as vLLM's
captures are: n decoders run as the smallest of `CUDA_BATCH_SIZES` that holds them, the rest
padding sequences (`pad_batch`) that decode token 0 at position 0 into a spare block the caches
keep past the block manager's, so they write nowhere a real row reads and no real row attends to
them; eager runs the same padded batch, so the bit-for-bit check compares like with like. On CPU a
padding row costs as much as a real one and only batch-1 steps are traced. Only stages whose
forward has no data-dependent Python take this path: batch invariant attention, no int8 tier, no
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

TRACE_AFTER = 16  # eager steps of a (batch size, bucket) before it is traced
# decoders a CUDA step is recorded for (vLLM's capture sizes are alike): n runs padded to the next
CUDA_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)

Replay = Callable[..., torch.Tensor]  # a bucket's recorded step: a TorchScript trace or a CUDA graph
Tensors = list[torch.Tensor]
# a step's trace inputs: hidden state or token, rotary rows, per group slot, context and mask, K, V
TraceInputs = tuple[torch.Tensor, Tensors, Tensors, Tensors, Tensors, Tensors, Tensors]
CACHE_ARGS = (5, 6)  # the trace inputs that are the caches' own K/V, read and written in place


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
    """The stage's forward for `batch_size` sequences decoding one token each, metadata rebuilt from
    tensors given as inputs: per KV group (`windows`, in order) its slots, padded contexts and
    masks; `groups[i]` is the KV group of the stage's cache `i`."""

    def __init__(
        self,
        model: nn.Module,
        windows: Mapping[int, int | None],
        buckets: Sequence[int],
        groups: Sequence[int],
        batch_size: int = 1,
    ) -> None:
        super().__init__()
        self.model, self.windows, self.buckets, self.groups = (
            model,
            dict(windows),
            list(buckets),
            list(groups),
        )
        self.batch_size = batch_size

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
        size = self.batch_size
        for (group, window), bucket, slot, context, mask in zip(
            self.windows.items(), self.buckets, slots, contexts, masks, strict=True
        ):
            lengths = np.full(size, bucket)
            part = AttentionPart(
                size,
                1,
                False,
                context_slots=context,
                query_lens=np.ones(size, np.int64),
                context_lens=lengths,
            )
            # what `fixed_chunk_mask` would build: the mask, and every query reaching the whole bucket
            part.fixed_masks[f"fixed{window}"] = (mask, np.array([bucket]))
            steps[group] = GroupStep(slot, [part])
        local = (rotary[2], rotary[3]) if len(rotary) == 4 else None
        meta = AttentionMetadata(rotary[0], rotary[1], steps, local, fixed_chunks=True)
        caches = [KVCache(k, v, group=g) for k, v, g in zip(keys, values, self.groups, strict=True)]
        return self.model(inputs, meta, caches, None)


def padded_size(num_seqs: int, sizes: Sequence[int]) -> int | None:
    """The smallest of `sizes` (ascending) that holds `num_seqs` sequences; None past the largest."""
    return next((size for size in sizes if size >= num_seqs), None)


def pad_batch(
    batch: ForwardBatch, inputs: torch.Tensor, size: int, pad_block: int
) -> tuple[ForwardBatch, torch.Tensor]:
    """`batch` of decoders grown to `size` sequences: each added one decodes token 0 (or a zero hidden
    state) at position 0 into `pad_block`, a block no sequence owns, and attends to that key alone,
    so it writes nowhere another sequence reads and no real row sees it; its output is dropped."""
    extra = size - batch.num_seqs
    if extra == 0:
        return batch, inputs

    def grown(array: np.ndarray, value: int) -> np.ndarray:
        return np.concatenate([array, np.full((extra, *array.shape[1:]), value, dtype=array.dtype)])

    padded = ForwardBatch(
        token_ids=grown(batch.token_ids, 0),
        positions=grown(batch.positions, 0),
        query_lens=grown(batch.query_lens, 1),
        context_lens=grown(batch.context_lens, 1),
        block_tables=grown(batch.block_tables, pad_block),
        logits_rows=np.arange(size, dtype=np.int64),
        block_size=batch.block_size,
        group_tables=tuple(grown(table, pad_block) for table in batch.group_tables),
    )
    return padded, torch.cat([inputs, inputs.new_zeros((extra, *inputs.shape[1:]))])


class TracedDecode:
    """Decode steps of one stage, by batch size and context bucket: eager until traced, then the
    trace. `batch_sizes` (ascending) are the sizes recorded: a step of n decoders runs as the
    smallest that holds n, the rest padding sequences (`pad_batch`) in a block of their own that
    the stage's caches reserve past the block manager's (`pad_block`); (1,) records batch-1 steps
    only, as on CPU, where padding rows would cost as much as real ones."""

    def __init__(
        self,
        model: nn.Module,
        rotary: RotaryTable,
        trace_after: int = TRACE_AFTER,
        windows: Mapping[int, int | None] | None = None,
        batch_sizes: Sequence[int] = (1,),
    ) -> None:
        """`windows`: the stage's KV groups and their windows (default one full-attention group 0)."""
        self.model, self.rotary, self.trace_after = model, rotary, trace_after
        self.windows = dict(windows or {0: None})
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.pad_block: int | None = None  # the caches' spare block, set when they are allocated
        # by (batch size, each group's bucket)
        self._traces: dict[tuple[int, tuple[int, ...]], Replay | None] = {}
        self._eager_steps: dict[tuple[int, tuple[int, ...]], int] = {}
        self._graph_pool: GraphPool | None = None  # the CUDA graphs' shared memory pool

    @property
    def pads_batches(self) -> bool:
        """Whether steps of several sequences are recorded (and so the caches need a spare block)."""
        return self.batch_sizes != (1,)

    def applies(self, batch: ForwardBatch) -> bool:
        """Sequences each decoding one token after at least one before it, every row's output wanted,
        no more of them than the largest size recorded."""
        n = batch.num_seqs
        if n > self.batch_sizes[-1] or batch.num_tokens != n or (n > 1 and self.pad_block is None):
            return False
        every_row = batch.logits_rows.shape[0] == n and bool((batch.logits_rows == np.arange(n)).all())
        return every_row and bool((batch.context_lens > 1).all())

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
        eager: Callable[[ForwardBatch, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The step's output: from the key's trace, or from `eager(batch, inputs)` (tracing the key
        once it has run `trace_after` eager steps); a batch is padded to its recorded size first."""
        num_seqs = batch.num_seqs
        size = padded_size(num_seqs, self.batch_sizes) or num_seqs
        if size > num_seqs:
            if self.pad_block is None:
                raise RuntimeError("a padded decode step before the caches reserved their spare block")
            batch, inputs = pad_batch(batch, inputs, size, self.pad_block)
        align = window_align(batch.block_size, fixed_chunks=True)
        views = [group_view(batch, group, window, align) for group, window in self.windows.items()]
        buckets = tuple(
            group_bucket(int(view.context_lens.max()), w)
            for view, w in zip(views, self.windows.values(), strict=True)
        )
        key = (size, buckets)
        if key in self._traces:
            trace = self._traces[key]
            if trace is None:
                return eager(batch, inputs)[:num_seqs]
            return trace(*self._trace_inputs(batch, views, inputs, caches, buckets))[:num_seqs]
        out = eager(batch, inputs)
        seen = self._eager_steps[key] = self._eager_steps.get(key, 0) + 1
        if seen >= self.trace_after:
            self._traces[key] = self._trace(batch, views, inputs, caches, buckets, out)
        return out[:num_seqs]

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
            context, lengths = view.context_slots(), view.context_lens
            rows, width = context.shape
            last = context[np.arange(rows), lengths - 1][:, None]
            padded = np.repeat(last, bucket, axis=1)  # masked keys: any slot of the row's context
            inside = np.arange(width)[None, :] < lengths[:, None]
            padded[:, :width] = np.where(inside, context, last)
            allowed = allowed_keys(np.ones(rows, np.int64), lengths, window, bucket)
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
        buckets: tuple[int, ...],
        eager_out: torch.Tensor,
    ) -> Replay | None:
        """The key's trace (a CUDA graph on a GPU), recorded on this step (whose K/V it writes
        again, the same values) and kept only if it gives eager's output bit for bit."""
        args = self._trace_inputs(batch, views, inputs, caches, buckets)
        groups = [c.group for c in caches]
        step = _DecodeStep(self.model, self.windows, buckets, groups, batch.num_seqs).eval()
        try:
            replay = self._record(step, args)
        except RuntimeError as error:  # a capture that met an op a graph cannot hold
            log.warning("decode step not recorded: it stays eager", buckets=buckets, error=error)
            return None
        if not torch.equal(replay(*args), eager_out):
            log.warning(
                "decode trace differs from eager: it stays eager",
                seqs=batch.num_seqs,
                context_buckets=buckets,
            )
            return None
        return replay

    def _record(self, step: _DecodeStep, args: Sequence[object]) -> Replay:
        if isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            return CudaGraphStep(step, args, self._graph_pool, in_place=CACHE_ARGS)
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
