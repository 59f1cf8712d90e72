"""bench/real_shapes.py writes a random-weight GGUF of a given shape that Mohawk opens as that shape,
with the bundled tokenizer (its vocabulary padded to the shape's); llama.cpp's quantizer, which
turns it into the benchmark's files, is the bench extra's and is not run here."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mohawk_common.model_store import open_model
from tests.bench import ROOT


def test_a_shape_is_written_as_a_gguf_mohawk_opens(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from real_shapes import Shape, write_f16

    shape = Shape(
        layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=49280, tied=False, rope_theta=1e4
    )
    path = tmp_path / "tiny-random-F16.gguf"
    write_f16(path, shape)
    source = open_model(path)
    config = source.config
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (2, 128, 256)
    assert (config.num_heads, config.num_kv_heads, config.vocab_size) == (4, 2, 49280)
    assert not config.tie_word_embeddings
    assert source.stored_format("layers.1.mlp.down_proj.weight") == "F16"
    down = source.read_tensor("layers.1.mlp.down_proj.weight")
    assert down.shape == (128, 256) and 0.015 < float(np.std(down)) < 0.025
    tokenizer = source.load_tokenizer()
    assert tokenizer.decode(tokenizer.encode("Hello there", add_special_tokens=False)) == "Hello there"


@pytest.mark.full_form  # make bench, before it writes an 8B's 16 GB of F16
def test_the_writer_holds_one_tensor_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An 8B's F16 file is 16 GB: the writer makes each tensor as it writes it. What Python holds
    as each tensor is written (gguf's own write, watched) does not grow with the tensors written."""
    import gguf

    sys.path.insert(0, str(ROOT / "bench"))
    from real_shapes import Shape, write_f16

    held: list[int] = []
    write = gguf.GGUFWriter.write_tensor_data

    def watched(self: gguf.GGUFWriter, tensor: np.ndarray, *args: object, **kwargs: object) -> None:
        held.append(tracemalloc.get_traced_memory()[0])
        write(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", watched)
    tracemalloc.start()
    try:
        write_f16(tmp_path / "deep-random-F16.gguf", Shape(40, 64, 1024, 4, 2, 49152, True, 1e4))
    finally:
        tracemalloc.stop()
    assert len(held) == 2 + 40 * 9  # the table and the final norm, then 9 tensors a layer
    table = 49152 * 64 * 2  # the largest tensor's F16 bytes; a layer's are 0.43 MB
    assert max(held) - min(held) < 2 * table  # holding every tensor would add 40 layers' 17 MB
    assert open_model(tmp_path / "deep-random-F16.gguf").config.num_layers == 40


@pytest.mark.full_form  # make bench, before it writes the real shapes; make test runs the llama one
def test_a_gemma_3_shape_is_written_as_llama_cpps_converter_writes_one(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from real_shapes import Shape, write_f16

    shape = Shape(6, 128, 256, 2, 1, 49152, True, 1e6, arch="gemma3", head_dim=64, sliding_window=32)
    path = tmp_path / "tiny-gemma-random-F16.gguf"
    write_f16(path, shape)
    source = open_model(path)
    config = source.config
    assert config.architecture == "gemma3_text" and config.tie_word_embeddings
    assert (config.num_layers, config.hidden_size, config.head_dim, config.num_kv_heads) == (6, 128, 64, 1)
    source.check_tensors()  # q/k norms and the post-attention and post-MLP norms are there
    norm = source.read_tensor("layers.0.self_attn.q_norm.weight")
    assert norm.shape == (64,) and not norm.any()  # stored as 1 + w, read back as w = 0


@pytest.mark.full_form
def test_a_qwen3_moe_shape_is_written_with_stacked_experts(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from real_shapes import Shape, write_f16

    shape = Shape(
        2, 128, 64, 4, 2, 49152, False, 1e6, arch="qwen3moe", head_dim=32, experts=4, experts_used=2
    )
    path = tmp_path / "tiny-moe-random-F16.gguf"
    write_f16(path, shape)
    source = open_model(path)
    config = source.config
    assert config.architecture == "qwen3_moe" and (config.num_experts, config.num_experts_per_tok) == (4, 2)
    source.check_tensors()  # the router and every expert's matrices, read out of the stacked tensors
    assert source.read_tensor("layers.1.mlp.experts.3.down_proj.weight").shape == (128, 64)
