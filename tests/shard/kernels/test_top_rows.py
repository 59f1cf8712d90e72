"""An LM head's shortlist in one pass: torch.topk's indices, ties to the lower index, a row's set
alone against any call it shares, and one node in a trace."""

from __future__ import annotations

import pytest
import torch

from mohawk_shard.kernels import top_rows
from mohawk_shard.kernels.library import kernel

pytestmark = pytest.mark.skipif(kernel() is None, reason="the compiled kernels do not build here")


@pytest.mark.parametrize(("rows", "width", "k"), [(1, 49152, 64), (5, 1000, 64), (3, 64, 64), (2, 37, 1)])
def test_it_gives_torch_topks_indices_best_first(rows: int, width: int, k: int) -> None:
    logits = torch.randn(rows, width, generator=torch.Generator().manual_seed(width))  # no ties
    assert torch.equal(top_rows.top_indices(logits, k), logits.topk(k, dim=-1).indices)


def test_ties_go_to_the_lower_index_and_the_order_is_value_then_index() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5, 3.0, 2.0]])
    assert top_rows.top_indices(logits, 4).tolist() == [[1, 3, 5, 2]]
    assert top_rows.top_indices(torch.zeros(1, 40), 3).tolist() == [[0, 1, 2]]


def test_a_rows_shortlist_does_not_depend_on_its_call() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(33, 4096, generator=gen).round(decimals=1)  # many ties
    alone = torch.cat([top_rows.top_indices(logits[i : i + 1], 64) for i in range(33)])
    assert torch.equal(top_rows.top_indices(logits, 64), alone)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(top_rows.top_indices(logits, 64), alone)
    finally:
        torch.set_num_threads(threads)


def test_a_trace_records_one_call() -> None:
    class Head(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return top_rows.top_indices(x * 2, 8)

    x = torch.randn(1, 500)
    traced = torch.jit.trace(Head(), (x,), check_trace=False)
    assert "mohawk::top_rows" in str(traced.graph)
    other = torch.randn(1, 500)
    assert torch.equal(traced(other), Head()(other))


def test_bad_input_is_refused_and_other_input_goes_to_torch() -> None:
    with pytest.raises(ValueError, match="k = 65 of rows of 64"):
        torch.ops.mohawk.top_rows(torch.zeros(1, 64), 65)
    with pytest.raises(ValueError, match="float32 rows"):
        torch.ops.mohawk.top_rows(torch.zeros(64), 8)
    halves = torch.randn(2, 300).half()
    assert torch.equal(top_rows.top_indices(halves, 5), halves.topk(5, dim=-1).indices)
