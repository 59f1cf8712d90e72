"""RMSNorm in one compiled call: torch's norm to within rounding, a row's bits alone in any call."""

from __future__ import annotations

from ctypes import CDLL

import pytest
import torch
import torch.nn.functional as F

from mohawk_shard.kernels import rms_norm_rows
from mohawk_shard.kernels.library import kernel

pytestmark = pytest.mark.skipif(kernel() is None, reason="the compiled kernels do not build here")


@pytest.mark.parametrize("width", [576, 64, 100])
def test_torchs_norm_to_within_rounding_and_each_row_alone(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    x, weight = torch.randn(40, width, generator=gen) * 3, torch.randn(width, generator=gen)
    out = rms_norm_rows.rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(out, F.rms_norm(x, (width,), weight, 1e-5), atol=1e-5, rtol=1e-5)
    alone = torch.cat([rms_norm_rows.rms_norm(x[i : i + 1], weight, 1e-5) for i in range(40)])
    assert torch.equal(out, alone)
    heads = rms_norm_rows.rms_norm(x.view(8, 5, width), weight, 1e-5)  # q/k norms: [T, H, D]
    assert torch.equal(heads.view(40, width), out)


def test_every_instruction_sets_build_gives_the_same_bits(isa_builds: dict[str, CDLL]) -> None:
    x, weight = torch.randn(7, 576), torch.randn(576)
    results = []
    for build in isa_builds.values():
        out = torch.empty_like(x)
        build.mohawk_rms_norm_rows(x.data_ptr(), 7, 576, weight.data_ptr(), 1e-5, out.data_ptr(), 2)
        results.append(out)
    assert all(torch.equal(results[0], other) for other in results[1:]), list(isa_builds)


def test_a_wrong_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        rms_norm_rows.rms_norm(torch.randn(2, 64), torch.randn(32), 1e-5)


def test_no_rows_give_no_rows() -> None:
    assert rms_norm_rows.rms_norm(torch.zeros(0, 64), torch.ones(64), 1e-5).shape == (0, 64)
