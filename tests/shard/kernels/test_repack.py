"""The loader's compiled repack (GGUF blocks straight into the kernels' layouts) gives what decoding
the blocks in numpy and packing them gives, bit for bit, for every type, with rows reordered (a
fused tensor's part, llama.cpp's rotary permutation undone) and parts filling one layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import StoredBlocks, concat_rows
from mohawk_shard.kernels import int4_rows, int8_rows
from mohawk_shard.kernels.library import kernel
from mohawk_shard.kernels.repack import int4_from_blocks, int8_from_blocks
from tests.common.model_store.test_kquant_blocks import random_blocks

pytestmark = pytest.mark.skipif(kernel() is None, reason="the compiled kernels do not build or run here")

CPU = torch.device("cpu")


def stored(type_name: str, rows: int, cols: int, seed: int, order: np.ndarray | None = None) -> StoredBlocks:
    raw = random_blocks(type_name, rows, cols, seed=seed)
    return StoredBlocks(raw, type_name, (rows if order is None else len(order), cols), order)


def decoded(blocks: StoredBlocks):  # type: ignore[no-untyped-def]
    tensor = decode_gguf_blocks(blocks.raw, blocks.type_name, (blocks.raw.shape[0], blocks.shape[1]))
    return tensor if blocks.rows is None else tensor.take_rows(blocks.rows)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K"])
def test_four_bit_blocks_repack_as_numpy_packs_them(type_name: str) -> None:
    order = np.random.default_rng(1).permutation(64)[:48]  # 48 of 64 file rows, reordered
    parts = [stored(type_name, 64, 512, seed=2, order=order), stored(type_name, 32, 512, seed=3)]
    packed = int4_from_blocks(parts, CPU)
    assert packed is not None
    weight = concat_rows([decoded(p) for p in parts])
    expected = int4_rows.pack(weight.codes, weight.scales, weight.mins, CPU)
    assert packed.out_features == expected.out_features == 80
    for name in ("codes", "scales", "mins"):
        assert torch.equal(getattr(packed, name), getattr(expected, name)), name


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_wider_blocks_repack_as_numpy_packs_them(type_name: str) -> None:
    order = np.random.default_rng(4).permutation(48)
    parts = [stored(type_name, 48, 512, seed=5, order=order), stored(type_name, 16, 512, seed=6)]
    packed = int8_from_blocks(parts, CPU)
    assert packed is not None
    expected = int8_rows.pack(concat_rows([decoded(p) for p in parts]), CPU)
    assert packed.offset == expected.offset and packed.out_features == 64
    for name in ("codes", "scales", "mins", "subs"):
        got, want = getattr(packed, name), getattr(expected, name)
        assert (got is None and want is None) or torch.equal(got, want), name


def test_what_the_repack_does_not_take_falls_back() -> None:
    assert int4_from_blocks([stored("Q4_K", 40, 256, seed=7)], CPU) is None  # 40 rows: not whole blocks
    assert int8_from_blocks([stored("Q4_K", 32, 256, seed=7)], CPU) is None  # a 4-bit type
    mixed = [stored("Q6_K", 16, 256, seed=8), stored("Q8_0", 16, 256, seed=9)]
    assert int8_from_blocks(mixed, CPU) is None  # one format a run
    huge = random_blocks("Q4_K", 16, 256, seed=10, exponents=(14, 15))  # d·sc past fp16
    assert int4_from_blocks([StoredBlocks(huge, "Q4_K", (16, 256))], CPU) is None
    assert int4_from_blocks([stored("Q4_0", 16, 64, seed=11)], torch.device("meta")) is None
