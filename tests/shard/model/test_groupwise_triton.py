"""The Triton kernel for GGUF's 5-, 6- and 8-bit codes on a GPU (`model/groupwise_triton.py`): the
stored weights times x, batch invariant bit for bit, and what `GroupwiseLinear` runs on CUDA for
bf16 rows. Skipped where torch sees no GPU or Triton does not import (torch's CPU wheels); run on a
GPU machine with `pytest tests/shard/model/test_groupwise_triton.py`."""

from __future__ import annotations

import pytest
import torch

from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_shard.model import groupwise_triton
from mohawk_shard.model.groupwise_linear import GroupwiseLinear
from tests.common.model_store.test_kquant_blocks import random_blocks
from tests.shard.model.test_groupwise_linear import fp16_tables

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not groupwise_triton.available(), reason="no CUDA device with Triton"
)
CUDA = torch.device("cuda")
TYPES = ["Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1"]


def layer(type_name: str, rows: int = 200, cols: int = 768, bias: torch.Tensor | None = None):
    raw = random_blocks(type_name, rows, cols, seed=len(type_name) + rows)
    weight = decode_gguf_blocks(raw, type_name, (rows, cols))
    return GroupwiseLinear(weight, CUDA, bias), torch.from_numpy(fp16_tables(weight).dequantize()).double()


@pytest.mark.parametrize("type_name", TYPES)
def test_the_kernel_multiplies_by_the_stored_weights(type_name: str) -> None:
    """200 output rows (not a multiple of the 16-column tile, nor of 32 or 64), 7 and 16
    activation rows through the kernel, 40 unpacked: within bf16's rounding of the weights and
    activations (fp32 sums), against fp64 products of the same bf16 rows."""
    bias = torch.randn(200)
    module, stored = layer(type_name, bias=bias)
    assert module.triton and "Triton" in module.extra_repr()
    for rows in (7, 16, 40):
        x = torch.randn(rows, 768).bfloat16()
        expected = x.double() @ stored.t() + bias.double()
        y = module(x.to(CUDA)).double().cpu()
        assert y.shape == expected.shape
        error = ((y - expected).abs().max() / expected.abs().max()).item()
        print(f"{type_name}, {rows} rows: max |y - fp64| / max |fp64| = {error:.2e}")
        assert error < 0.01


@pytest.mark.parametrize("type_name", ["Q6_K", "Q8_0"])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(
    type_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, _ = layer(type_name, rows=1024, cols=2048)

    def unpacked(*_: object) -> None:
        raise AssertionError("a call of up to MAX_ROWS rows unpacked")

    monkeypatch.setattr(module, "_unpacked_matmul", unpacked)
    x = torch.randn(64, 2048, device=CUDA, dtype=torch.bfloat16)
    alone = torch.cat([module(x[i : i + 1]) for i in range(64)])
    for batch in (3, 8, 16):  # up to MAX_ROWS: past it a call unpacks into cuBLAS
        together = torch.cat([module(x[i : i + batch]) for i in range(0, 64, batch)])
        assert torch.equal(together, alone), f"batches of {batch}"


def test_fp32_rows_keep_the_unpacking_path_and_agree() -> None:
    module, stored = layer("Q6_K")
    x = torch.randn(5, 768)
    y = module(x.to(CUDA)).double().cpu()  # fp32: unpacked (tl.dot would round rows to tf32)
    expected = x.double() @ stored.t()
    assert ((y - expected).abs().max() / expected.abs().max()).item() < 1e-4


def test_bad_activations_are_a_clear_error() -> None:
    module, _ = layer("Q8_0")
    codes, scales = module.codes, module.scales
    assert scales is not None
    with pytest.raises(ValueError, match="bf16 or fp16 CUDA"):
        groupwise_triton.groupwise_matmul(torch.randn(2, 768, device=CUDA), codes, scales, 32)
    with pytest.raises(ValueError, match="do not fit"):
        groupwise_triton.groupwise_matmul(torch.randn(2, 512, device=CUDA).bfloat16(), codes, scales, 32)
