"""A dense `Linear` gives a row the same bits in any call of two rows or more, wherever the row sits
in it (`invariant_rows`: on an AVX2 CPU MKL computes the tail rows of a short call with another
kernel), in both weight layouts. A lone row keeps its own kernel (`linear.py` says why)."""

from __future__ import annotations

import pytest
import torch

from mohawk_shard.model.linear import Linear, invariant_rows


def test_the_padded_row_counts() -> None:
    counts = (0, 1, 3, 4, 5, 8, 9, 11, 12, 13, 150)
    assert [invariant_rows(n) for n in counts] == [0, 1, 4, 4, 8, 8, 12, 12, 12, 13, 150]


@pytest.mark.parametrize("transposed", [False, True])
def test_a_row_has_the_same_bits_in_any_call(transposed: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    layer = Linear(64, 192, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(192, 64, generator=gen))
        layer.bias.copy_(torch.randn(192, generator=gen))  # type: ignore[union-attr]
    if transposed:
        layer.store_transposed()
    x = torch.randn(160, 64, generator=gen)
    first_of_four = torch.cat([layer(torch.cat((x[r : r + 1], x[:3])))[:1] for r in range(160)])
    for rows in (*range(2, 24), 64, 150, 160):
        for first in (0, 3, 10):
            count = min(rows, 160 - first)
            expected = first_of_four[first : first + count]
            assert torch.equal(layer(x[first : first + count]), expected), (rows, first)
