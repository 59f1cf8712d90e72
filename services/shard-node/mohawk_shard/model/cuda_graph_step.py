"""A decode step recorded as a CUDA graph: one launch replays every kernel of the step.

Design. On a GPU a batch-1 decode step of a small model is several hundred kernel launches, each
costing the CPU a few microseconds in Python and the CUDA driver, while most kernels run for less:
the GPU waits on the host. A CUDA graph records the launches once (`torch.cuda.graph`) and replays
them all with one call. A graph keeps the addresses it was recorded with, so the step's varying
inputs (the tensors, and lists of tensors, `traced_decode.py` gives its trace: the token or hidden
state, the rotary rows, and per KV group the slots written, the padded context slots and the mask)
are copied into buffers the graph owns before each replay; the caches' K/V tensors are the caches
themselves, whose storage stays put
until the caches are reallocated, which drops every graph (`TracedDecode.forget`); and the output
is the graph's own buffer, cloned before the next replay writes it again. The step runs twice on a
side stream before the capture, as torch's documentation asks, so that cuBLAS handles and the
caching allocator settle outside the graph; the graphs of one stage share one memory pool. The
replayed kernels are the eager step's, in the same order on the same shapes, and `TracedDecode`
keeps a graph only when its replay gives eager's output bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # torch's name for a graph memory pool's handle (imported lazily by torch itself)
    from torch.cuda import _POOL_HANDLE as GraphPool

WARMUP_RUNS = 2  # eager runs on a side stream before the capture


class CudaGraphStep:
    """`step(*args)` recorded once as a CUDA graph; calling it copies new `args` in and replays.

    Each argument is a tensor or a list of tensors, copied into the graph's own buffers on every
    call, except those at `in_place` (the caches' K/V lists), which the graph reads where they lie."""

    def __init__(
        self,
        step: nn.Module,
        args: Sequence[object],
        pool: GraphPool | None = None,
        in_place: Sequence[int] = (),
    ) -> None:
        self._in_place = set(in_place)
        self._inputs = [a if i in self._in_place else _buffers(a) for i, a in enumerate(args)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step(*self._inputs)
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph, pool=pool):
            self._output: torch.Tensor = step(*self._inputs)

    def __call__(self, *args: object) -> torch.Tensor:
        for index, (buffer, value) in enumerate(zip(self._inputs, args, strict=True)):
            if index in self._in_place:
                continue
            if isinstance(buffer, torch.Tensor) and isinstance(value, torch.Tensor):
                buffer.copy_(value)
            elif isinstance(buffer, list) and isinstance(value, list):
                for held, new in zip(buffer, value, strict=True):
                    held.copy_(new)
            else:
                raise TypeError(f"argument {index} of a recorded step is {type(value).__name__}")
        self._graph.replay()
        return self._output.clone()


def _buffers(arg: object) -> object:
    """The graph's own copy of a tensor argument, or of each tensor of a list argument."""
    if isinstance(arg, torch.Tensor):
        return arg.clone()
    if isinstance(arg, list) and all(isinstance(a, torch.Tensor) for a in arg):
        return [a.clone() for a in arg]
    raise TypeError(f"a recorded step takes tensors or lists of tensors, not {type(arg).__name__}")
