"""Settings of a shard node's engine (section `shard:` of config/mohawk.yaml, env MOHAWK_*)."""

from __future__ import annotations

import argparse
from typing import ClassVar, Literal, TypeVar

from pydantic import Field

from mohawk_common.settings import KVBlockSettings, ModelFileSettings

WeightsMode = Literal["native", "int4", "bf16", "fp32"]
KVCacheDtype = Literal["auto", "float32", "int8"]
T = TypeVar("T")


def add_format_flags(parser: argparse.ArgumentParser) -> None:
    """`--weights` and `--kv-cache-dtype`, for every command that builds stages (from the settings)."""
    from mohawk_common.settings_flags import add_setting_flags

    add_setting_flags(parser, EngineSettings, ("weights", "kv_cache_dtype"))


class EngineSettings(ModelFileSettings, KVBlockSettings):
    yaml_section: ClassVar[str] = "shard"

    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: str = Field("auto", description="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16")
    weights: WeightsMode = Field(
        "native",
        description="native: run the file's quantized tensors as stored (GGUF Q4_0, Q4_1, Q4_K, Q5_0, "
        "Q5_1, Q5_K, Q6_K, Q8_0; F16/BF16/F32 and safetensors in the compute dtype); int4: quantize "
        "linear weights groupwise to 4 bits at load; bf16/fp32: dequantize to that dtype",
    )
    num_kv_blocks: int | None = Field(None, ge=1, description="KV blocks; none = from kv_cache_memory_mb")
    kv_cache_memory_mb: int | None = Field(
        None,
        ge=1,
        description="KV budget; none = on a shard node a quarter of its memory limit, on CPU at most "
        "1024; in one process (mohawk generate) 1024 on CPU, 60% of the memory free after the "
        "weights on CUDA (kv_budget.py)",
    )
    max_num_seqs: int = Field(64, ge=1, description="most sequences running at once")
    max_num_batched_tokens: int = Field(512, ge=1, description="token budget of one step (chunked prefill)")
    max_model_len: int | None = Field(None, ge=2, description="context cap; none = the model's own")
    kv_cache_dtype: KVCacheDtype = Field(
        "auto",
        description="auto: KV stored fp16 where the compute dtype is fp32 (CPU), else in the compute "
        "dtype; float32: fp32; int8: older full blocks int8 (two tiers)",
    )
    enable_prefix_caching: bool = True
    batch_invariant: bool = Field(
        True,
        description="one arithmetic per row: a sequence's tokens do not change with the batch, the "
        "chunking, a prefix hit or a failover (every 4-bit matmul on the int4 kernel, attention in "
        "fixed chunks); false: dense prefill matmuls and fused attention, which on a CPU ran at half "
        "the throughput (bench/results/batch-invariance-cpu.json)",
    )
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; none = torch's default")


def engine_choice(name: str, given: T | None) -> T:
    """`given`, else `EngineSettings`' default for setting `name`: a backend built without a
    choice gets the settings' own default, written once, there."""
    if given is not None:
        return given
    default: T = EngineSettings.model_fields[name].default
    return default
