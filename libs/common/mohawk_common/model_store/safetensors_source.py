"""A Hugging Face model directory: config.json plus one or several `.safetensors` files.

The safetensors layout is simple enough to read without a framework: an 8-byte little-endian
header length, a JSON header mapping each tensor name to its dtype, shape and byte range, then the
raw little-endian data. Reading it ourselves lets us seek to just the tensors of a layer range and
widen bf16 exactly (a bf16 value is the top 16 bits of the float32 with the same value), without
torch, which this library must not import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import check_architecture, config_from_hf, generation_eos_token_ids
from mohawk_common.model_store.source import LM_HEAD, ModelSource, one_line

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in a safetensors file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class SafetensorsSource(ModelSource):
    """A directory with config.json and safetensors weights (single file or sharded)."""

    def __init__(self, path: Path, hf_config: Any, entries: dict[str, TensorEntry]) -> None:
        eos = generation_eos_token_ids(path)
        super().__init__(path, config_from_hf(hf_config, path.name, eos), hf_config)
        self._entries = entries

    @classmethod
    def open(cls, directory: Path) -> SafetensorsSource:
        """Read config.json and the safetensors headers of `directory`; no tensor data is read."""
        from transformers import AutoConfig

        config_file = directory / "config.json"
        check_architecture(_read_json(config_file).get("model_type"), config_file)
        try:
            hf_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
        except Exception as exc:
            raise ModelLoadError(f"cannot read {directory / 'config.json'}: {one_line(exc)}") from exc
        entries: dict[str, TensorEntry] = {}
        for file in weight_files(directory):
            entries.update(read_header(file))
        return cls(directory, hf_config, entries)

    def _entry(self, name: str) -> TensorEntry:
        keys = [name] if name == LM_HEAD else [f"model.{key}" for key in moe_aliases(name)] + [name]
        entry = next((self._entries[key] for key in keys if key in self._entries), None)
        if entry is None:
            entry = self._fused_expert(name)
        if entry is None:
            raise ModelLoadError(f"{self.path} has no tensor {keys[0]}")
        return entry

    def _fused_expert(self, name: str) -> TensorEntry | None:
        """Expert `name`'s rows inside a transformers 5 fused [experts, rows, columns] tensor
        (`mlp.experts.gate_up_proj`, gate rows then up rows; `mlp.experts.down_proj`), as an
        entry of its own: each expert is a contiguous byte range, so only its bytes are read."""
        match = _EXPERT.match(name)
        if match is None:
            return None
        layer, expert, part = match.group(1), int(match.group(2)), match.group(3)
        fused = f"model.layers.{layer}.mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        entry = self._entries.get(fused)
        if entry is None or len(entry.shape) != 3 or entry.dtype not in _DTYPES:
            return None
        _, rows, columns = entry.shape
        start, stop = (rows // 2, rows) if part == "up" else (0, rows // 2) if part == "gate" else (0, rows)
        itemsize = _DTYPES[entry.dtype].itemsize
        offset = entry.offset + (expert * rows + start) * columns * itemsize
        return replace(
            entry, shape=(stop - start, columns), offset=offset, nbytes=(stop - start) * columns * itemsize
        )

    def stored_format(self, name: str) -> str:
        return self._entry(self.file_tensor(name)[0]).dtype

    def stored_shape(self, name: str) -> tuple[int, ...]:
        return self._entry(self.stored_name(name)).shape

    def _read_tensor(self, name: str) -> np.ndarray:
        return read_tensor(self._entry(name))

    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        return tokenizer


_EXPERT = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_MIXTRAL_EXPERT = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def moe_aliases(name: str) -> list[str]:
    """`name`, then the name Mixtral checkpoints keep a MoE tensor under (`block_sparse_moe.gate`,
    `block_sparse_moe.experts.E.w1/w3/w2` for gate/up/down)."""
    if ".mlp.gate." not in name and ".mlp.experts." not in name:
        return [name]
    mixtral = name.replace(".mlp.", ".block_sparse_moe.")
    for canonical, stored in _MIXTRAL_EXPERT.items():
        mixtral = mixtral.replace(f".{canonical}.", f".{stored}.")
    return [name, mixtral]


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory: those its index names, else all of them."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map")
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [file.name for file in files if not file.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names missing files: {', '.join(missing)}")
        return files
    # Mistral repos also ship `consolidated.safetensors` in another naming scheme; skip it.
    files = sorted(f for f in directory.glob("*.safetensors") if not f.name.startswith("consolidated"))
    if not files:
        raise ModelLoadError(f"model directory {directory} has no .safetensors weights")
    return files


def read_header(file: Path) -> dict[str, TensorEntry]:
    """Parse a safetensors header into the position of each tensor (no tensor data is read)."""
    try:
        with file.open("rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if not 0 < header_size <= MAX_HEADER_BYTES:
                raise ValueError(f"bad header size {header_size}")
            header = json.loads(handle.read(header_size))
        file_size = file.stat().st_size
        entries = {}
        for key, info in header.items():
            if key == "__metadata__":
                continue
            begin, end = (int(x) for x in info["data_offsets"])
            offset = 8 + header_size + begin
            entry = TensorEntry(file, str(info["dtype"]), tuple(info["shape"]), offset, end - begin)
            if entry.nbytes < 0 or entry.offset + entry.nbytes > file_size:
                raise ValueError(f"tensor {key} lies outside the file")
            entries[key] = entry
        return entries
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"cannot read safetensors file {file}: {one_line(exc)}") from exc


def read_tensor(entry: TensorEntry) -> np.ndarray:
    """Read one tensor's bytes from its file and return it as a float32 array."""
    dtype = _DTYPES.get(entry.dtype)
    if dtype is None:
        raise ModelLoadError(f"unsupported tensor dtype {entry.dtype} in {entry.file}")
    count = int(np.prod(entry.shape, dtype=np.int64))
    if count * dtype.itemsize != entry.nbytes:
        raise ModelLoadError(f"tensor of shape {list(entry.shape)} in {entry.file} has a bad byte size")
    try:
        with entry.file.open("rb") as handle:
            handle.seek(entry.offset)
            raw = np.fromfile(handle, dtype=dtype, count=count)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {entry.file}: {one_line(exc)}") from exc
    if raw.size != count:
        raise ModelLoadError(f"{entry.file} is truncated")
    if entry.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry.shape)
    return raw.astype(np.float32, copy=False).reshape(entry.shape)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return data
