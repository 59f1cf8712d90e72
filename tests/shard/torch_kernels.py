"""Running a test on torch's own kernels (tinygemm, fixed chunks of torch ops, F.rms_norm), as a
machine without the compiled CPU kernels does: what `MOHAWK_CPU_KERNELS=off` gives a process."""

from __future__ import annotations

import pytest

from mohawk_shard.kernels import attend_rows, int4_rows, int8_rows, library, repack, rms_norm_rows

KERNEL_PATHS = ["compiled", "torch"]


def choose(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """`compiled`: the kernels (skips where they do not build); `torch`: every module that asks
    `kernel()` is told there is none."""
    if path == "compiled":
        if library.kernel() is None:
            pytest.skip("the compiled CPU kernels do not build here")
        return
    for module in (attend_rows, int4_rows, int8_rows, repack, rms_norm_rows):
        monkeypatch.setattr(module, "kernel", lambda: None)
