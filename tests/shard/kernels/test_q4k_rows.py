"""The Q4_K CPU kernel: the loader's repack of a file's Q4_K blocks into its layout (the file's own
integers and fp16 bits), its arithmetic (int8 activations a super-block of 256, as llama.cpp's
q8_K, integer sums a super-block), its accuracy, and a row's bits alone against any call it shares
(other rows, their number and order, thread count, instruction set, a trace)."""

from __future__ import annotations

from ctypes import CDLL

import numpy as np
import pytest
import torch

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import StoredBlocks, concat_rows
from mohawk_shard.kernels import q4k_rows
from mohawk_shard.kernels.library import kernel
from mohawk_shard.kernels.repack import q4k_from_blocks
from mohawk_shard.model.quantized_layers import Int4Linear
from tests.common.model_store.test_kquant_blocks import random_blocks

pytestmark = pytest.mark.skipif(
    kernel() is None, reason="the compiled kernels do not build or run here (x86 with AVX2 and g++)"
)

CPU = torch.device("cpu")
SHAPES = [(960, 512), (112, 1536)]  # 112: a last superblock of columns of 3 column blocks


def blocks(rows: int, cols: int, seed: int, order: np.ndarray | None = None) -> StoredBlocks:
    raw = random_blocks("Q4_K", rows, cols, seed=seed)
    return StoredBlocks(raw, "Q4_K", (rows if order is None else len(order), cols), order)


def held(packed: q4k_rows.PackedQ4K) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return packed.codes, packed.subs, packed.supers


def packed_weight(rows: int, cols: int, seed: int) -> tuple[q4k_rows.PackedQ4K, torch.Tensor]:
    """A random Q4_K tensor repacked, and its weight as gguf-py's decoding gives it (fp64)."""
    part = blocks(rows, cols, seed)
    packed = q4k_from_blocks([part], CPU)
    assert packed is not None
    decoded = decode_gguf_blocks(part.raw, "Q4_K", part.shape)
    return packed, torch.from_numpy(decoded.dequantize().astype(np.float64))


def test_the_repack_holds_the_files_integers_and_bits() -> None:
    """Rows reordered (a fused tensor's part) and two parts filling one layout: the layout's weight is
    the file's, bit for bit, and it is what `pack` lays out from the decoded integers."""
    order = np.random.default_rng(1).permutation(64)[:48]
    parts = [blocks(64, 512, seed=2, order=order), blocks(32, 512, seed=3)]
    packed = q4k_from_blocks(parts, CPU)
    assert packed is not None and packed.out_features == 80
    decoded = [decode_gguf_blocks(p.raw, "Q4_K", (p.raw.shape[0], 512)) for p in parts]
    weight = concat_rows([decoded[0].take_rows(order), decoded[1]])
    dense = q4k_rows.dense_weight(*held(packed), torch.float32)
    assert torch.equal(dense, torch.from_numpy(weight.dequantize()))
    # the integers back out of the decoded products: d·sc and dmin·m are exact in fp32
    raw = np.concatenate([parts[0].raw[order], parts[1].raw])
    d = raw.reshape(80, 2, 144)[:, :, 0:2].copy().view(np.float16)[..., 0]
    dmin = raw.reshape(80, 2, 144)[:, :, 2:4].copy().view(np.float16)[..., 0]
    scales = weight.scales / np.repeat(d.astype(np.float32), 8, axis=1)
    mins = -weight.mins / np.repeat(dmin.astype(np.float32), 8, axis=1)
    expected = q4k_rows.pack(weight.codes, scales.round(), mins.round(), d, dmin)
    for name in ("codes", "subs", "supers"):
        assert torch.equal(getattr(packed, name), getattr(expected, name)), name


def q8k_reference(x: torch.Tensor, packed: q4k_rows.PackedQ4K) -> torch.Tensor:
    """fp64 y with the kernel's activations (per row and super-block of 256: d = max|x| / 127, codes
    round(x / d) in fp32, ties to even) and no fp32 rounding after them."""
    rows = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 256)
    scale = (np.abs(rows).max(axis=-1) / np.float32(127)).astype(np.float32)
    inverse = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(rows * inverse[..., None]), -127, 127) * scale[..., None].astype(np.float64)
    return torch.from_numpy(codes.reshape(x.shape)) @ q4k_rows.dense_weight(*held(packed), torch.float64).t()


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_arithmetic_is_int8_activations_a_super_block(out_features: int, in_features: int) -> None:
    packed, weight = packed_weight(out_features, in_features, seed=4)
    x = torch.randn(33, in_features, generator=torch.Generator().manual_seed(5))
    x[5, 7] = 40.0  # an outlier costs its own super-block's precision only
    x[6, :256] = 0.0  # a super-block of zeros has d = 0
    y = q4k_rows.matmul(x, *held(packed))
    assert y.shape == (33, out_features)
    expected = q8k_reference(x, packed)
    # the fp32 epilogue's rounding only, once a super-block: parts in ten million
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6
    exact = x.double() @ weight.t()
    # int8 activations a super-block, as llama.cpp's q8_K: about a percent of a row's largest output
    # (1.2% at most here), a few on the row whose outlier takes its super-block's scale (3.0%; one
    # scale a group of 32 held that row to 1.0%, tests/shard/kernels/test_int4_rows.py)
    error = (y.double() - exact).abs().max(dim=1).values / exact.abs().max(dim=1).values
    assert torch.cat([error[:5], error[6:]]).max().item() < 2e-2, error.max().item()
    assert error[5].item() < 5e-2, error[5].item()


def test_the_largest_codes_scales_and_activations_do_not_overflow() -> None:
    """Top codes (15), scales and minimums (63) against ±127 in every input: the int16 pairs of a
    group (16 products of at most 15 · 127) and the int32 super-block sums stay exact."""
    raw = random_blocks("Q4_K", 32, 512, seed=6).reshape(32, 2, 144)
    raw[:, :, 4:16] = 0xFF  # every 6-bit scale and minimum 63
    raw[:, :, 16:] = 0xFF  # every code 15
    part = StoredBlocks(raw.reshape(32, -1), "Q4_K", (32, 512))
    packed = q4k_from_blocks([part], CPU)
    assert packed is not None
    x = torch.ones(5, 512)
    x[1::2] = -1.0
    y = q4k_rows.matmul(x, *held(packed))
    expected = q8k_reference(x, packed)
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_a_rows_bits_do_not_depend_on_its_call(out_features: int, in_features: int) -> None:
    packed, _ = packed_weight(out_features, in_features, seed=7)
    x = torch.randn(150, in_features, generator=torch.Generator().manual_seed(8))
    alone = torch.cat([q4k_rows.matmul(x[i : i + 1], *held(packed)) for i in range(150)])
    rng = np.random.default_rng(9)
    for num_rows in (2, 3, 4, 5, 7, 8, 9, 12, 31, 32, 33, 64, 129):
        rows = torch.from_numpy(rng.integers(0, 150, num_rows))  # any order, repeats allowed
        assert torch.equal(q4k_rows.matmul(x[rows], *held(packed)), alone[rows]), num_rows
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert torch.equal(q4k_rows.matmul(x, *held(packed)), alone), f"{count} threads"
    finally:
        torch.set_num_threads(threads)


def test_the_layer_runs_the_kernel_and_a_trace_records_it() -> None:
    packed, _ = packed_weight(192, 512, seed=10)
    layer = Int4Linear(packed, CPU, source_format="Q4_K")
    assert (layer.out_features, layer.in_features) == (192, 512) and layer.q4k
    x = torch.randn(3, 512)
    assert torch.equal(layer(x), q4k_rows.matmul(x, *held(packed)))
    assert torch.equal(layer(x[None]), q4k_rows.matmul(x, *held(packed))[None])  # a batch dimension
    assert torch.equal(layer.dense_weight(), q4k_rows.dense_weight(*held(packed), torch.bfloat16))
    traced = torch.jit.trace(lambda rows: layer(rows) * 2, (x[:1],), check_trace=False)
    assert "mohawk::q4k_rows_mm" in str(traced.graph)
    assert torch.equal(traced(x[1:2]), layer(x[1:2]) * 2)


def test_every_instruction_sets_build_gives_the_same_bits(isa_builds: dict[str, CDLL]) -> None:
    """AVX2 (vpmaddubsw, vpmaddwd against the scales), AVX-512 (the same, twice as wide) and VNNI
    (vpdpbusd, vpmulld) where it runs."""
    packed, _ = packed_weight(576, 512, seed=11)
    x = torch.randn(37, 512, generator=torch.Generator().manual_seed(12))
    outs = {isa: torch.empty(37, 576) for isa in isa_builds}
    for isa, y in outs.items():
        isa_builds[isa].mohawk_q4k_rows_mm(
            x.data_ptr(), 37, 512, packed.codes.data_ptr(), packed.subs.data_ptr(), packed.supers.data_ptr(),
            576, y.data_ptr(), 2,
        )  # fmt: skip
    op = q4k_rows.matmul(x, *held(packed))
    assert all(torch.equal(y, op) for y in outs.values()), list(outs)


def test_wrong_rows_and_what_the_path_does_not_take() -> None:
    packed, _ = packed_weight(64, 256, seed=13)
    with pytest.raises(ValueError, match="float32 rows of 256"):
        q4k_rows.matmul(torch.randn(2, 128), *held(packed))
    assert q4k_rows.matmul(torch.zeros(0, 256), *held(packed)).shape == (0, 64)
    assert q4k_from_blocks([blocks(40, 256, seed=14)], CPU) is None  # 40 rows: not whole column blocks
    other = StoredBlocks(random_blocks("Q4_0", 16, 256, seed=15), "Q4_0", (16, 256))
    assert q4k_from_blocks([other], CPU) is None  # another type: the group-scaled layout's
    assert q4k_from_blocks([blocks(16, 256, seed=16)], torch.device("meta")) is None
