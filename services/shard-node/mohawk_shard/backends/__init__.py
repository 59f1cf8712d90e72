"""Backends: the array library a stage runs on; `make_backend` picks one by name (MLX loads only if asked)."""

from __future__ import annotations

from typing import Protocol

from mohawk_common.errors import ConfigError
from mohawk_common.model_store import ModelSource
from mohawk_shard.config import engine_choice
from mohawk_shard.engine.backend import Backend
from mohawk_shard.model.weight_formats import weights_dtype

BACKENDS = ("torch", "mlx")


class BackendChoices(Protocol):
    """The settings a backend is built from (`EngineSettings` and the node's settings have them)."""

    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def weights(self) -> str: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def batch_invariant(self) -> bool: ...


def backend_from_settings(
    name: str, settings: BackendChoices, source: ModelSource, start: int, end: int
) -> Backend:
    """`make_backend` with its choices read from `settings`, so a new choice is passed in one place."""
    return make_backend(
        name,
        source,
        start,
        end,
        device=settings.device,
        dtype=settings.dtype,
        weights=settings.weights,
        kv_cache_dtype=settings.kv_cache_dtype,
        batch_invariant=settings.batch_invariant,
    )


def make_backend(
    name: str,
    source: ModelSource,
    start: int,
    end: int,
    *,
    device: str | None = None,
    dtype: str | None = None,
    weights: str | None = None,
    kv_cache_dtype: str | None = None,
    batch_invariant: bool | None = None,
) -> Backend:
    """Layers [start, end) of `source` on backend `name` (torch: CPU or CUDA; mlx: Apple Silicon, or
    a Linux CPU through the mlx-cpu wheel). `weights` is the settings' weight format (native, int4,
    bf16, fp32); `kv_cache_dtype` auto, float32 (on mlx only where it computes in fp32) or int8 (two
    tiers, torch only);
    `batch_invariant` off lets a torch stage pick its 4-bit matmul by the step's size and attend
    through fused kernels (faster, but a row's numbers then depend on its step). A choice not
    given is `EngineSettings`' default."""
    device, dtype = engine_choice("device", device), engine_choice("dtype", dtype)
    weights = engine_choice("weights", weights)
    kv_cache_dtype = engine_choice("kv_cache_dtype", kv_cache_dtype)
    batch_invariant = engine_choice("batch_invariant", batch_invariant)
    if name == "torch":
        from mohawk_shard.backends.torch_backend import TorchBackend

        return TorchBackend(
            source,
            start,
            end,
            device=device,
            dtype=dtype,
            weights=weights,
            kv_cache_dtype=kv_cache_dtype,
            batch_invariant=batch_invariant,
        )
    if name == "mlx":
        if kv_cache_dtype == "int8":
            raise ConfigError(
                "kv_cache_dtype='int8' is torch only: the mlx backend keeps its KV cache in the compute dtype"
            )
        try:
            from mohawk_shard.backends.mlx_backend import MlxBackend
        except ImportError as exc:
            raise ConfigError(
                f"the mlx backend needs MLX and mlx-lm: pip install 'mohawk[mlx]' ({exc})"
            ) from exc
        computes = weights_dtype(weights, dtype).replace("auto", "float32")  # MLX's auto: fp32
        if kv_cache_dtype == "float32" and computes != "float32":
            raise ConfigError(
                f"kv_cache_dtype='float32' on an mlx stage computing in {computes}: it keeps its KV "
                "cache in the compute dtype"
            )
        return MlxBackend(source, start, end, device=device, dtype=dtype, weights=weights)
    raise ConfigError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
