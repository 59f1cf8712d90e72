"""The weight bytes a node reports (model/footprint.py, node/capacity.py) against the bytes its torch
stages really hold, for the bundled model's native formats (Q4_1 layers, tied Q8_0 table) and fp32."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mohawk_common.model_store import ModelSource
from mohawk_shard.backends import make_backend
from mohawk_shard.local import layer_ranges
from mohawk_shard.model.footprint import stage_weight_bytes, weights_format
from mohawk_shard.node.capacity import measure_capacity


@pytest.mark.parametrize("weights", ["native", "fp32"])
@pytest.mark.parametrize("split", [(), (10, 20)], ids=["1-stage", "3-stage"])
def test_reported_bytes_are_what_the_stages_hold(
    bundled: ModelSource, weights: str, split: Sequence[int]
) -> None:
    capacity = measure_capacity(
        bundled,
        device="cpu",
        dtype="auto",
        weights=weights,
        block_size=16,
        memory_limit_mb=None,
        kv_cache_memory_mb=None,
    )
    ends = stage_weight_bytes(bundled, weights, "float32")
    assert (ends.embedding, ends.head) == (capacity.embedding_weight_bytes, capacity.head_weight_bytes)
    num_layers = bundled.config.num_layers
    for start, end in layer_ranges(num_layers, split):
        stage = make_backend("torch", bundled, start, end, device="cpu", weights=weights)
        has_ends = {"embedding": start == 0, "head": end == num_layers}
        reported = (end - start) * capacity.layer_weight_bytes + ends.held(**has_ends)
        print(f"{weights} [{start}, {end}): reported {reported}, held {stage.weight_bytes}")
        assert abs(reported - stage.weight_bytes) <= 0.02 * stage.weight_bytes


def test_ends_in_native_formats_are_smaller_than_dense(bundled: ModelSource) -> None:
    """The Q8_0 table is about a quarter of fp32; the rescored head holds a 4-bit copy and the table."""
    native, dense = (
        stage_weight_bytes(bundled, "native", "float32"),
        stage_weight_bytes(bundled, "fp32", "float32"),
    )
    assert native.embedding < 0.3 * dense.embedding
    assert native.shared == native.embedding < native.head < 0.5 * dense.head
    assert dense.shared == dense.embedding


def test_weights_format_names_the_layers_format(bundled: ModelSource) -> None:
    assert weights_format(bundled, "native", "float32") == "int4 (Q4_1)"
    assert weights_format(bundled, "int4", "bfloat16") == "int4 (Q4_1)"
    assert weights_format(bundled, "fp32", "float32") == "float32"
    assert weights_format(bundled, "bf16", "bfloat16") == "bfloat16"
