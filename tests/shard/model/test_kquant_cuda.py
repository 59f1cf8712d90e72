"""K-quants held natively on CUDA: the tiny Q4_K_M-style file of test_kquant_native.py built on the
GPU (Q4_K through `_weight_int4pack_mm`, Q6_K/Q5_0 through the groupwise int8 path) against the
dequantized fp32 path on CPU. Skipped where torch sees no GPU; run on a GPU machine with
`pytest tests/shard/model/test_kquant_cuda.py`."""

from __future__ import annotations

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.backends.torch_backend import TorchBackend
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.groupwise_linear import ConcatLinear, GroupwiseLinear
from mohawk_shard.model.quantized_layers import Int4Linear
from tests.shard.model.test_kquant_native import NUM_LAYERS, write_kquant_gguf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


@pytest.fixture(scope="module")
def kquant(tmp_path_factory: pytest.TempPathFactory) -> ModelSource:
    path = tmp_path_factory.mktemp("kquant") / "tiny-q4_k_m.gguf"
    write_kquant_gguf(path)
    return open_model(path)


def _logits(source: ModelSource, tokens: list[int], *, device: str, weights: str, dtype: str) -> torch.Tensor:
    backend = make_backend("torch", source, 0, NUM_LAYERS, device=device, weights=weights, dtype=dtype)
    assert isinstance(backend, TorchBackend)
    if weights == "native":
        qkv = backend.model.get_submodule("layers.0.self_attn.qkv_proj")
        assert isinstance(qkv, ConcatLinear)
        assert [type(p) for p in qkv.parts] == [Int4Linear, GroupwiseLinear]
        assert all(b.device.type == device for b in backend.model.buffers())
    backend.allocate_kv_cache(4, 16)
    batch = ForwardBatch.build([(tokens, 0, [0, 1], True)], 16, all_logits=True)
    return backend.forward(batch, None).float().cpu()


TOKENS = [3, 17, 99, 5, 64, 2, 110, 7]


def test_native_k_quants_on_cuda_match_the_fp32_path_on_cpu(kquant: ModelSource) -> None:
    """fp32 activations on the GPU: only the 4-bit kernel's bf16 scales and activations differ from
    the dequantized fp32 path (measured on an H200: 0.12 of 21.8, 0.6%)."""
    reference = _logits(kquant, TOKENS, device="cpu", weights="fp32", dtype="float32")
    native = _logits(kquant, TOKENS, device="cuda", weights="native", dtype="float32")
    error = (native - reference).abs().max()
    print(f"fp32: max |cuda native - cpu fp32| {error:.4f} of max |fp32| {reference.abs().max():.4f}")
    assert error < 0.01 * reference.abs().max()


def test_native_k_quants_in_bf16_match_dense_bf16_on_cuda(kquant: ModelSource) -> None:
    """bf16 compute throughout: native weights against the same weights dequantized to bf16, so the
    comparison is the kernels', not bf16's own rounding against fp32 (measured on an H200: 0.16 of
    21.8 against dense bf16, which itself lies 0.74 from the fp32 path)."""
    dense = _logits(kquant, TOKENS, device="cuda", weights="bf16", dtype="bfloat16")
    native = _logits(kquant, TOKENS, device="cuda", weights="native", dtype="bfloat16")
    reference = _logits(kquant, TOKENS, device="cpu", weights="fp32", dtype="float32")
    error = (native - dense).abs().max()
    print(
        f"bf16: max |native - dense bf16| {error:.4f}, |dense bf16 - cpu fp32| "
        f"{(dense - reference).abs().max():.4f}, of max |fp32| {reference.abs().max():.4f}"
    )
    assert error < 0.02 * reference.abs().max()
