"""The 5-to-8-bit CPU kernel (Q8_0, Q5_0, Q5_1, Q5_K codes a byte each, Q6_K's in 6 bits): its
layout holds the file's codes and weights in the bytes it says, its arithmetic is int8 activations
and exact integer dot products (Q6_K's sub-block scales applied in integers), and a row's bits do
not depend on its call (other rows, their number and order, thread count, instruction set, a
trace, Q6_K's bytes rebuilt in registers or once into scratch)."""

from __future__ import annotations

import dataclasses
from ctypes import CDLL

import numpy as np
import pytest
import torch

from mohawk_common.model_store.quantized import GroupQuantized
from mohawk_shard.kernels import int8_rows
from mohawk_shard.kernels.library import kernel
from tests.shard.kernels.test_int4_rows import quantized_activations

pytestmark = pytest.mark.skipif(
    kernel() is None, reason="the compiled kernels do not build or run here (x86 with AVX2 and g++)"
)

CPU = torch.device("cpu")
FORMATS = ["Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"]
SHAPES = [(256, 512), (112, 256)]  # 112: a last superblock of 3 column blocks


def fp16_exact(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float32)


def weight(fmt: str, out_features: int, in_features: int, seed: int) -> GroupQuantized:
    """Random codes and tables of `fmt`, as `gguf_blocks.decode_gguf_blocks` gives them."""
    rng = np.random.default_rng(seed)
    groups = (out_features, in_features // 32)
    scales = fp16_exact(rng.random(groups) * 0.01 + 0.001)
    if fmt == "Q8_0":
        codes = rng.integers(-128, 128, (out_features, in_features)).astype(np.int8)
        return GroupQuantized(codes, scales, None, 8, 32, fmt)
    if fmt == "Q5_0":
        codes = rng.integers(-16, 16, (out_features, in_features)).astype(np.int8)
        return GroupQuantized(codes, scales, None, 5, 32, fmt)
    if fmt in ("Q5_1", "Q5_K"):
        codes = rng.integers(0, 32, (out_features, in_features)).astype(np.uint8)
        return GroupQuantized(codes, scales, -fp16_exact(rng.random(groups) * 0.1), 5, 32, fmt)
    subs = rng.integers(-128, 128, (out_features, in_features // 16)).astype(np.int8)
    supers = (rng.random((out_features, in_features // 256)) * 1e-4 + 1e-5).astype(np.float16)
    per_16 = subs.reshape(out_features, -1, 16).astype(np.float32) * supers.astype(np.float32)[..., None]
    codes = rng.integers(-32, 32, (out_features, in_features)).astype(np.int8)
    return GroupQuantized(codes, per_16.reshape(out_features, -1), None, 6, 16, fmt, (subs, supers))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_the_layout_holds_the_files_codes_and_weights(fmt: str, out_features: int, in_features: int) -> None:
    w = weight(fmt, out_features, in_features, seed=1)
    assert int8_rows.supports(w, CPU)
    packed = int8_rows.pack(w, CPU)
    rows = torch.arange(out_features)
    assert torch.equal(int8_rows.row_codes(packed, rows), torch.from_numpy(w.codes.astype(np.int16)))
    assert torch.equal(int8_rows.dense_weight(packed), torch.from_numpy(w.dequantize()))
    assert packed.in_features == in_features
    held = sum(
        t.numel() * t.element_size()
        for t in (packed.codes, packed.scales, packed.mins, packed.subs)
        if t is not None
    )
    per_weight = {
        "Q8_0": 1.0625,
        "Q5_0": 1.0625,
        "Q5_1": 1.125,
        "Q5_K": 1.125,
        "Q6_K": 210 / 256,
    }  # Q6_K: the file's
    assert held == out_features * in_features * per_weight[fmt]


def int8_reference(x: torch.Tensor, w: GroupQuantized) -> torch.Tensor:
    """fp64 y = Σ_g scale·d·(the group's integer dot product) (+ min·the group's sum): the kernel's
    arithmetic with no fp32 rounding in its epilogue; Q6_K's per 16 from its own scales."""
    q, d, sums = quantized_activations(x)
    n, k = w.codes.shape
    size = w.group_size
    codes = w.codes.reshape(n, k // size, size).astype(np.float64)
    by_size = q.reshape(q.shape[0], k // size, size)
    dots = np.einsum("mgk,ngk->mng", by_size, codes)  # exact: integers far below 2^53
    d_by_size = np.repeat(d, 32 // size, axis=1)
    y = (dots * d_by_size[:, None, :] * w.scales.astype(np.float64)[None]).sum(-1)
    if w.mins is not None:
        y += (sums[:, None, :] * w.mins.astype(np.float64)[None]).sum(-1)
    return torch.from_numpy(y)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_arithmetic_is_int8_activations_and_integer_dots(fmt: str) -> None:
    w = weight(fmt, 256, 512, seed=2)
    packed = int8_rows.pack(w, CPU)
    x = torch.randn(33, 512, generator=torch.Generator().manual_seed(3))
    x[5, 7] = 40.0  # an outlier costs its own group's precision only
    x[6, :32] = 0.0  # a group of zeros has d = 0
    y = int8_rows.matmul(x, packed)
    assert y.shape == (33, 256)
    expected = int8_reference(x, w)
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6
    exact = x.double() @ torch.from_numpy(w.dequantize()).double().t()
    error = (y.double() - exact).abs().max(dim=1).values / exact.abs().max(dim=1).values
    # about half a percent of a row's largest output; 2.2% at most, Q8_0's row with the outlier
    assert error.max().item() < 3e-2, error.max().item()
    assert error.median().item() < 1e-2, error.median().item()


TOP_CODES = {"Q8_0": 127, "Q5_0": 15, "Q5_1": 31, "Q5_K": 31, "Q6_K": 31}  # held as 255, 31, 31, 31, 63


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_largest_codes_and_activations_do_not_saturate(fmt: str) -> None:
    """Without VNNI the pairs of a run of code words are summed in int16 lanes (`Format::run`):
    the top code against ±127 in every input must still give the exact integer dot products."""
    w = weight(fmt, 64, 512, seed=8)
    w = dataclasses.replace(w, codes=np.full_like(w.codes, TOP_CODES[fmt]))
    packed = int8_rows.pack(w, CPU)
    x = torch.ones(5, 512)  # every activation quantizes to 127 (-127 in the negated rows)
    x[1::2] = -1.0
    expected = int8_reference(x, w)
    y = int8_rows.matmul(x, packed)
    assert ((y.double() - expected).abs().max() / expected.abs().max()).item() < 2e-6


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_bits_do_not_depend_on_its_call(fmt: str) -> None:
    w = weight(fmt, 112, 256, seed=4)
    packed = int8_rows.pack(w, CPU)
    x = torch.randn(150, 256, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([int8_rows.matmul(x[i : i + 1], packed) for i in range(150)])
    rng = np.random.default_rng(6)
    for num_rows in (2, 3, 4, 5, 7, 9, 31, 33, 129):
        rows = torch.from_numpy(rng.integers(0, 150, num_rows))  # any order, repeats allowed
        assert torch.equal(int8_rows.matmul(x[rows], packed), alone[rows]), num_rows
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert torch.equal(int8_rows.matmul(x, packed), alone), f"{count} threads"
    finally:
        torch.set_num_threads(threads)


def test_a_trace_records_one_call_with_the_same_bits() -> None:
    packed = int8_rows.pack(weight("Q6_K", 64, 256, seed=9), CPU)

    class Step(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return int8_rows.matmul(x, packed) * 2

    x = torch.randn(1, 256)
    traced = torch.jit.trace(Step(), (x,), check_trace=False)
    assert "mohawk::int8_rows_mm" in str(traced.graph)
    other = torch.randn(1, 256)
    assert torch.equal(traced(other), Step()(other))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_instruction_sets_build_gives_the_same_bits(fmt: str, isa_builds: dict[str, CDLL]) -> None:
    """AVX2 (vpmaddubsw; Q8_0 nibble by nibble), AVX-512 and VNNI (vpdpbusd) where it runs."""
    packed = int8_rows.pack(weight(fmt, 112, 512, seed=7), CPU)
    x = torch.randn(37, 512, generator=torch.Generator().manual_seed(8))
    outs = {isa: torch.empty(37, 112) for isa in isa_builds}

    def pointer(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    for isa, y in outs.items():  # each build's own C function (only the process's build is the op)
        status = isa_builds[isa].mohawk_int8_rows_mm(
            x.data_ptr(), 37, 512, packed.codes.data_ptr(), packed.scales.data_ptr(), pointer(packed.mins),
            pointer(packed.subs), packed.offset, 112, y.data_ptr(), 2,
        )  # fmt: skip
        assert status == 0
    op = int8_rows.matmul(x, packed)
    assert all(torch.equal(y, op) for y in outs.values()), list(outs)


def test_what_no_format_has_is_refused() -> None:
    packed = int8_rows.pack(weight("Q6_K", 64, 256, seed=10), CPU)
    with pytest.raises(ValueError, match="float32 rows of 256"):
        int8_rows.matmul(torch.randn(2, 128), packed)
    ones = torch.ones(4, 8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="no format has"):  # minimums beside sub-block scales
        x = torch.randn(1, 256)
        torch.ops.mohawk.int8_rows_mm(x, packed.codes, packed.scales, ones, packed.subs, 64, 32)
    unfit = weight("Q8_0", 64, 64, seed=11)
    big = GroupQuantized(unfit.codes, unfit.scales * 1e8, None, 8, 32, "Q8_0")
    assert not int8_rows.supports(big, CPU)  # scales past fp16: GroupwiseLinear's torch path
    assert int8_rows.matmul(torch.zeros(0, 64), int8_rows.pack(unfit, CPU)).shape == (0, 64)
