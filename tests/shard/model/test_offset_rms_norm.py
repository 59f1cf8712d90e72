"""Gemma's norm, scaling by 1 + w: it follows a weight written in place (also one made under
inference mode, as a stage's are), on the compiled kernel within float rounding of torch's own
formula."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mohawk_shard.model.blocks import OffsetRMSNorm


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.double(), (x.shape[-1],), weight.double() + 1.0, eps).float()


def test_the_norm_scales_by_one_plus_w_and_follows_a_written_weight() -> None:
    torch.manual_seed(0)
    norm = OffsetRMSNorm(640, 1e-6)
    x = torch.randn(3, 640)
    with torch.inference_mode():
        norm.weight.copy_(torch.randn(640) * 0.1)
        first = norm(x)
        torch.testing.assert_close(first, reference(x, norm.weight, 1e-6), rtol=1e-5, atol=1e-5)
        assert torch.equal(norm(x), first)
        norm.weight.copy_(torch.randn(640) * 0.1)  # as a load writes it
        torch.testing.assert_close(norm(x), reference(x, norm.weight, 1e-6), rtol=1e-5, atol=1e-5)


def test_bf16_rows_keep_their_dtype() -> None:
    norm = OffsetRMSNorm(64, 1e-6)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(x.float(), norm.weight, 1e-6), rtol=1e-2, atol=1e-2)


def test_a_norm_made_under_inference_mode_runs() -> None:
    with torch.inference_mode():
        norm = OffsetRMSNorm(32, 1e-6)
        x = torch.randn(2, 32)
        torch.testing.assert_close(norm(x), reference(x, norm.weight, 1e-6), rtol=1e-5, atol=1e-5)
