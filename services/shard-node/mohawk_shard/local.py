"""Build an engine whose stages all run in this process: one stage, or a chain split at layer boundaries."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import structlog

from mohawk_common.errors import ConfigError
from mohawk_common.kv_groups import max_tokens_in, model_kv_groups
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import backend_from_settings
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.block_manager import BlockManager
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.scheduler import Scheduler, SchedulerConfig
from mohawk_shard.engine.stage import Stage
from mohawk_shard.kv_budget import local_kv_budget_mb

log = structlog.get_logger("mohawk.shard")


def layer_ranges(num_layers: int, split_points: Sequence[int]) -> list[tuple[int, int]]:
    """[0, a), [a, b), ..., [z, num_layers) from split points a < b < ... < z inside (0, num_layers)."""
    points = list(split_points)
    if any(p <= 0 or p >= num_layers for p in points) or points != sorted(set(points)):
        raise ConfigError(
            f"split points {points} must be increasing layer indices between 1 and {num_layers - 1}"
        )
    bounds = [0, *points, num_layers]
    return list(itertools.pairwise(bounds))


def kv_block_count(settings: EngineSettings, backends: Sequence[Backend]) -> int:
    """Blocks that fit the KV budget when every stage in this process holds the same block ids."""
    if settings.num_kv_blocks is not None:
        return settings.num_kv_blocks
    per_block = sum(b.kv_bytes_per_block(settings.block_size) for b in backends)
    device, free = backends[0].device, None
    if settings.kv_cache_memory_mb is None and device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
    budget_mb = local_kv_budget_mb(settings.kv_cache_memory_mb, device, free)
    return max(1, (budget_mb << 20) // per_block)


def int8_saving_per_block(settings: EngineSettings, backends: Sequence[Backend]) -> int | None:
    """Bytes a block saves across all stages once int8, or None when the KV cache has one tier."""
    if settings.kv_cache_dtype == "auto":
        return None
    from mohawk_shard.backends.torch_backend import TorchBackend

    torch_backends = [b for b in backends if isinstance(b, TorchBackend)]
    return sum(b.kv_tier_bytes(settings.block_size).saved for b in torch_backends)


def build_local_engine(
    settings: EngineSettings,
    split_points: Sequence[int] = (),
    source: ModelSource | None = None,
    backends: Sequence[str] = (),
) -> LLMEngine:
    """An engine over the stages cut at `split_points`; `backends` names each stage's backend
    (default torch for all)."""
    if settings.num_threads is not None:
        import torch

        torch.set_num_threads(settings.num_threads)
    source = source or open_model(settings.model)
    config = source.config
    ranges = layer_ranges(config.num_layers, split_points)
    names = list(backends) or ["torch"] * len(ranges)
    if len(names) != len(ranges):
        raise ConfigError(f"{len(names)} backends named for {len(ranges)} stages")
    stages: list[Backend] = []
    for (start, end), name in zip(ranges, names, strict=True):
        backend = backend_from_settings(name, settings, source, start, end)
        log.info(
            "stage loaded",
            layers=f"[{start}, {end})",
            backend=name,
            device=backend.device,
            weight_mb=round(backend.weight_bytes / 2**20, 1),
        )
        stages.append(backend)
    num_blocks = kv_block_count(settings, stages)
    for backend in stages:
        backend.allocate_kv_cache(num_blocks, settings.block_size)
    max_model_len = min(
        config.max_position_embeddings, settings.max_model_len or config.max_position_embeddings
    )
    groups = model_kv_groups(config)
    chunk = settings.max_num_batched_tokens
    max_model_len = max_tokens_in(groups, num_blocks, settings.block_size, max_model_len, chunk)
    log.info(
        "kv cache",
        num_blocks=num_blocks,
        block_size=settings.block_size,
        max_model_len=max_model_len,
        kv_groups=len(groups),
    )
    scheduler = Scheduler(
        SchedulerConfig(settings.max_num_seqs, settings.max_num_batched_tokens, max_model_len),
        BlockManager(
            num_blocks,
            settings.block_size,
            enable_prefix_caching=settings.enable_prefix_caching,
            int8_saving_per_block=int8_saving_per_block(settings, stages),
            groups=groups,
        ),
    )
    return LLMEngine(
        [Stage(b, settings.block_size, len(groups)) for b in stages],
        scheduler,
        source.load_decoder(),
        eos_token_ids=config.eos_token_ids,
        vocab_size=config.vocab_size,
    )
