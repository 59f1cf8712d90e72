"""Bounds on the compiled-kernel caches of torch's CPU matmuls, set before torch loads.

Design. On CPUs with native bf16 matmuls (AVX512-BF16, AMX) torch runs a bf16 matmul through
oneDNN, and two caches keep the kernel it compiles for each shape it meets: oneDNN's own primitive
cache and, above it, torch's ideep layer cache, each 1,024 entries by default. A kernel holds its
code and scratch memory (one layer of SmolLM2's four 4-bit linears over 400 steps of 96-512 rows
grew a process by 810 MiB: `bench/native_caches.py`), and a serving stage meets a new shape for
each row count of its prefill steps: the shard's RSS ended the 1,000-session load test 10 to 13 %
above its level before (a heap profile put the growth in `dnnl::impl::malloc`, under the
primitives of `ideep::matmul_forward`). Both
caches are bounded here, unless the operator's environment sets them; `Int4Linear` pads its dense
rows so that the shapes a stage meets fit within the bound, and no kernel is compiled twice.
Each variable is read once, when the library first needs it, so this runs before torch is imported.
"""

from __future__ import annotations

from collections.abc import MutableMapping

# oneDNN's primitive cache and the ideep cache torch keeps above it
NATIVE_CACHE_LIMITS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bound_native_caches(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Sets each limit `environ` does not already set; returns the ones it set."""
    chosen = {name: value for name, value in NATIVE_CACHE_LIMITS.items() if name not in environ}
    environ.update(chosen)
    return chosen
