"""Bad GGUF files become one-line `ModelLoadError`s naming the file, the tensor and what was expected.

Each file is a tiny random-weight GGUF written here (`write_llama_gguf`), then broken one way.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import open_model
from tests.common.model_store.test_store_errors import assert_one_line
from tests.common.model_store.test_store_gguf_tiny import HIDDEN, random_llama_state, write_llama_gguf

Q_PROJ = "layers.0.self_attn.q_proj.weight"


def tiny(tmp_path: Path, state: dict[str, np.ndarray] | None = None) -> Path:
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, state or random_llama_state(False), GGMLQuantizationType.Q4_1)
    return path


def set_tensor_type(path: Path, gguf_name: str, value: int) -> None:
    """Overwrite the type field of one tensor's entry in the file's tensor index."""
    data = bytearray(path.read_bytes())
    name = gguf_name.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    num_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * num_dims, value)
    path.write_bytes(bytes(data))


def test_truncated_tensor_data(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(
        error,
        f"cannot read GGUF file {path}",
        "the file is truncated: tensor blk.1.ffn_down.weight (Q4_1 [64, 96]) needs bytes",
        f"-{len(data)}, the file has {len(data) - 100}",
    )


def test_truncated_header(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(error, str(path), "the file is truncated: it ends at byte 200, inside its header")


def test_unknown_quantization_type(tmp_path: Path) -> None:
    path = tiny(tmp_path)
    set_tensor_type(path, "blk.0.attn_q.weight", 250)
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(
        error, str(path), "tensor blk.0.attn_q.weight has unknown quantization type 250 (known: F32, F16,"
    )


def test_not_gguf_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file, say")
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(
        error, str(path), "not a GGUF file: it starts with b'PK\\x03\\x04', a GGUF file with b'GGUF'"
    )
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(error, str(path), "not a GGUF file: it is empty")


def test_unknown_architecture_names_the_file(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(error, f"{path}: unsupported architecture 'mamba' (supported: llama, mistral,")


def test_missing_tensor(tmp_path: Path) -> None:
    state = random_llama_state(False)
    del state["layers.1.mlp.up_proj.weight"]
    source = open_model(tiny(tmp_path, state))  # the config is whole: only the index tells
    expected = f"GGUF file {source.path} has no tensor blk.1.ffn_up.weight (for layers.1.mlp.up_proj.weight)"
    with pytest.raises(ModelLoadError) as error:
        source.check_tensors()
    assert_one_line(error, expected)
    with pytest.raises(ModelLoadError) as error:
        source.load_weights(1, 2, embedding=False, head=False)
    assert_one_line(error, expected)


def test_misshapen_tensor(tmp_path: Path) -> None:
    state = random_llama_state(False)
    state[Q_PROJ] = state[Q_PROJ][:, : HIDDEN // 2].copy()
    source = open_model(tiny(tmp_path, state))
    expected = f"tensor {Q_PROJ} of {source.path} has shape [64, 32], the config implies [64, 64]"
    with pytest.raises(ModelLoadError) as error:
        source.check_tensors()
    assert_one_line(error, expected)
    with pytest.raises(ModelLoadError) as error:
        source.read_quantized(Q_PROJ)
    assert_one_line(error, expected)


def test_rows_not_whole_blocks(tmp_path: Path) -> None:
    state = random_llama_state(False)
    path = tiny(tmp_path, state)
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    struct.pack_into("<Q", data, at, 48)  # 48 columns: one and a half Q4_1 blocks a row
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as error:
        open_model(path)
    assert_one_line(
        error,
        str(path),
        "tensor blk.0.attn_q.weight has shape [64, 48]: its rows are not whole Q4_1 blocks of 32",
    )
