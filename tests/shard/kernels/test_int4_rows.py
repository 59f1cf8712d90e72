"""The row-block 4-bit CPU kernel: its layout, its arithmetic (int8 activations a group of 32, as
llama.cpp's), its accuracy, and a row's bits alone against any call it shares (other rows, their
number and order, thread count, instruction set, a trace)."""

from __future__ import annotations

from ctypes import CDLL

import numpy as np
import pytest
import torch

from mohawk_shard.kernels import int4_rows
from mohawk_shard.kernels.library import kernel

pytestmark = pytest.mark.skipif(
    kernel() is None, reason="the compiled kernels do not build or run here (x86 with AVX2 and g++)"
)

CPU = torch.device("cpu")


def weight(out_features: int, in_features: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random codes with Q4_1-like scales and mins."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (out_features, in_features), dtype=np.uint8)
    groups = in_features // 32
    scales = (rng.random((out_features, groups)) * 0.02 + 0.002).astype(np.float32)
    mins = -(rng.random((out_features, groups)) * 0.2).astype(np.float32)
    return codes, scales, mins


def dequantized(codes: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> torch.Tensor:
    """The weight in fp64, from scales and mins as the layout holds them (fp16)."""
    scales, mins = (t.astype(np.float16).astype(np.float64) for t in (scales, mins))
    n, k = codes.shape
    groups = codes.reshape(n, k // 32, 32).astype(np.float64) * scales[..., None] + mins[..., None]
    return torch.from_numpy(groups.reshape(n, k))


SHAPES = [(960, 576), (576, 1536), (112, 96)]  # 112: a last superblock of 3 column blocks


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_layout_holds_the_codes_and_the_weight(out_features: int, in_features: int) -> None:
    codes, scales, mins = weight(out_features, in_features, seed=1)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    rows = torch.arange(out_features)
    assert torch.equal(int4_rows.unpack_rows(packed.codes, rows), torch.from_numpy(codes))
    dense = int4_rows.dense_weight(packed.codes, packed.scales, packed.mins, out_features, torch.float64)
    torch.testing.assert_close(dense, dequantized(codes, scales, mins), atol=1e-6, rtol=1e-6)


def quantized_activations(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's view of fp32 rows [M, K]: per group of 32, d = max|x| / 127, the codes
    round(x / d) (fp32 arithmetic, ties to even), and the sum of the quantized group, d·Σcodes."""
    rows = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 32)
    scale = (np.abs(rows).max(axis=-1) / np.float32(127)).astype(np.float32)
    inverse = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(rows * inverse[..., None]), -127, 127)
    return codes, scale.astype(np.float64), scale.astype(np.float64) * codes.sum(axis=-1)


def int8_reference(x: torch.Tensor, codes: np.ndarray, scales: np.ndarray, mins: np.ndarray) -> torch.Tensor:
    """fp64 y = sum_g scale·d·(integer dot of the group) + min·(the group's sum): the kernel's
    arithmetic with no fp32 rounding in its epilogue."""
    q, d, sums = quantized_activations(x)
    n, k = codes.shape
    w = codes.reshape(n, k // 32, 32).astype(np.float64)
    dots = np.einsum("mgk,ngk->mng", q, w)  # exact: integers far below 2^53
    scales, mins = (t.astype(np.float16).astype(np.float64) for t in (scales, mins))
    y = (dots * d[:, None, :] * scales[None]).sum(-1) + (sums[:, None, :] * mins[None]).sum(-1)
    return torch.from_numpy(y)


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_arithmetic_is_int8_activations_a_group(out_features: int, in_features: int) -> None:
    codes, scales, mins = weight(out_features, in_features, seed=2)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    x = torch.randn(33, in_features, generator=torch.Generator().manual_seed(3))
    x[5, 7] = 40.0  # an outlier costs its own group's precision only
    x[6, :32] = 0.0  # a group of zeros has d = 0
    y = int4_rows.matmul(x, packed.codes, packed.scales, packed.mins, out_features)
    assert y.shape == (33, out_features)
    expected = int8_reference(x, codes, scales, mins)
    # the fp32 epilogue's rounding only: parts in ten million of the output's size
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6
    exact = x.double() @ dequantized(codes, scales, mins).t()
    # int8 activations: about a percent of a row's largest output at most (1.02% here, on the row
    # with the outlier; fp32 activations gave 3e-7, tinygemm's bf16 ones a few parts in a thousand)
    error = (y.double() - exact).abs().max(dim=1).values / exact.abs().max(dim=1).values
    assert error.max().item() < 2e-2, error.max().item()


def test_the_largest_codes_and_activations_do_not_saturate() -> None:
    """Without VNNI a group's products are summed in int16 lanes (16 of at most 15 * 127 each): the
    top code against ±127 in every input must still give the exact integer dot product."""
    codes, scales, mins = weight(64, 512, seed=7)
    codes = np.full_like(codes, 15)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    x = torch.ones(5, 512)  # every activation quantizes to 127 (-127 in the negated rows)
    x[1::2] = -1.0
    y = int4_rows.matmul(x, packed.codes, packed.scales, packed.mins, 64)
    expected = int8_reference(x, codes, scales, mins)
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6


@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_a_rows_bits_do_not_depend_on_its_call(out_features: int, in_features: int) -> None:
    codes, scales, mins = weight(out_features, in_features, seed=4)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    held = (packed.codes, packed.scales, packed.mins, out_features)
    x = torch.randn(200, in_features, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([int4_rows.matmul(x[i : i + 1], *held) for i in range(200)])
    rng = np.random.default_rng(6)
    for num_rows in (2, 3, 4, 5, 7, 8, 9, 12, 31, 32, 33, 64, 129):
        rows = torch.from_numpy(rng.integers(0, 200, num_rows))  # any order, repeats allowed
        assert torch.equal(int4_rows.matmul(x[rows], *held), alone[rows]), num_rows
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            assert torch.equal(int4_rows.matmul(x, *held), alone), f"{count} threads"
    finally:
        torch.set_num_threads(threads)


def test_a_trace_records_one_call_with_the_same_bits() -> None:
    codes, scales, mins = weight(192, 576, seed=9)
    packed = int4_rows.pack(codes, scales, mins, CPU)

    class Step(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return int4_rows.matmul(x, packed.codes, packed.scales, packed.mins, 192) * 2

    x = torch.randn(1, 576)
    traced = torch.jit.trace(Step(), (x,), check_trace=False)
    assert "mohawk::int4_rows_mm" in str(traced.graph)
    other = torch.randn(1, 576)
    assert torch.equal(traced(other), Step()(other))


def test_every_instruction_sets_build_gives_the_same_bits(isa_builds: dict[str, CDLL]) -> None:
    """AVX2 (vpmaddubsw), AVX-512 (the same, twice as wide) and VNNI (vpdpbusd) where it runs."""
    codes, scales, mins = weight(576, 576, seed=7)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(8))
    outs = {isa: torch.empty(37, 576) for isa in isa_builds}
    for isa, y in outs.items():  # each build's own C function (only the process's build is the op)
        isa_builds[isa].mohawk_int4_rows_mm(
            x.data_ptr(), 37, 576, packed.codes.data_ptr(), packed.scales.data_ptr(), packed.mins.data_ptr(),
            576, y.data_ptr(), 2,
        )  # fmt: skip
    op = int4_rows.matmul(x, packed.codes, packed.scales, packed.mins, 576)
    assert all(torch.equal(y, op) for y in outs.values()), list(outs)


def test_wrong_rows_are_refused() -> None:
    codes, scales, mins = weight(64, 64, seed=10)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    with pytest.raises(ValueError, match="float32 rows of 64"):
        int4_rows.matmul(torch.randn(2, 32), packed.codes, packed.scales, packed.mins, 64)
    with pytest.raises(ValueError, match="float32 rows of 64"):
        int4_rows.matmul(torch.randn(2, 64).double(), packed.codes, packed.scales, packed.mins, 64)


def test_no_rows_give_no_rows() -> None:
    """A step whose rows need no logits hands the head zero rows."""
    codes, scales, mins = weight(64, 64, seed=11)
    packed = int4_rows.pack(codes, scales, mins, CPU)
    assert int4_rows.matmul(torch.zeros(0, 64), packed.codes, packed.scales, packed.mins, 64).shape == (0, 64)
    assert int4_rows.unpack_rows(packed.codes, torch.zeros(0, dtype=torch.int64)).shape == (0, 64)


def test_a_table_taller_than_one_packing_slice_packs_as_one_piece() -> None:
    """`pack` widens a bounded slice of rows at a time (a 262k-row table would take 8x its bytes):
    the words are those of packing every row at once."""
    rows, columns = int4_rows._PACK_ROWS + 48, 64
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (rows, columns), dtype=np.uint8)
    scales = rng.random((rows, columns // 32), dtype=np.float32)
    packed = int4_rows.pack(codes, scales, -scales, torch.device("cpu"))
    shifts = (4 * np.arange(8, dtype=np.uint32))[None, None, :]
    whole = np.bitwise_or.reduce(codes.astype(np.uint32).reshape(rows, -1, 8) << shifts, axis=-1)
    expected = whole.reshape(rows // 16, 16, -1).transpose(0, 2, 1).view(np.int32)
    np.testing.assert_array_equal(packed.codes.numpy(), expected)
