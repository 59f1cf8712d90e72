"""A stage built from a slice package holds what one built from the file holds, byte for byte.

The package carries the file's blocks (`slice_source.py`), so the loader takes the same kernels:
same modules, same buffers and parameters bit for bit, same logits, on a Q4_K_M-style GGUF with
Q4_K, Q6_K and Q5_0 parts, untied and with a tied Q6_K table.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mohawk_common.model_store import ModelSource, open_model, slice_source
from mohawk_common.model_store.slice_source import SliceSource, slice_weights
from mohawk_shard.backends.torch_backend import TorchBackend
from tests.shard.model.test_kquant_native import HIDDEN, NUM_LAYERS, VOCAB, _logits, _stage, write_kquant_gguf


@pytest.fixture(params=["untied", "tied"])
def kquant(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    top = {"token_embd": ((VOCAB, HIDDEN), "Q6_K")} if request.param == "tied" else None
    path = tmp_path / f"{request.param}.gguf"
    write_kquant_gguf(path, **({} if top is None else {"top": top}))
    # this file has no tokenizer; the package's tokenizer files are not what is tested here
    monkeypatch.setattr(slice_source, "_tokenizer_files", lambda tokenizer: {})
    monkeypatch.setattr(type(open_model(path)), "load_tokenizer", lambda self: None)
    return open_model(path)


def _held(stage: TorchBackend) -> dict[str, tuple[torch.dtype, bytes]]:
    tensors = [*stage.model.named_parameters(), *stage.model.named_buffers()]
    return {name: (t.dtype, t.detach().contiguous().numpy().tobytes()) for name, t in tensors}


@pytest.mark.parametrize(("start", "end"), [(0, 1), (1, NUM_LAYERS), (0, NUM_LAYERS)])
def test_a_stage_from_a_slice_holds_and_computes_what_one_from_the_file_does(
    kquant: ModelSource, start: int, end: int
) -> None:
    fields, weights = slice_weights(kquant, start, end)
    assert {t["dtype"] for t in fields["tensors"]} == {"U8", "F32"}  # blocks and norms
    source = SliceSource.from_slice(fields, weights)
    from_file, from_slice = _stage(kquant, start, end), _stage(source, start, end)
    assert from_slice.formats.counts == from_file.formats.counts and not from_slice.formats.fallbacks
    assert [type(m) for m in from_slice.model.modules()] == [type(m) for m in from_file.model.modules()]
    assert _held(from_slice) == _held(from_file)
    assert from_slice.weight_bytes == from_file.weight_bytes
    if (start, end) == (0, NUM_LAYERS):
        tokens = [3, 17, 99, 5, 64, 2, 110, 7]
        assert torch.equal(_logits(from_slice, tokens), _logits(from_file, tokens))
