"""A lean GGUF reader: the tensor index and scalar metadata of a memory-mapped GGUF file.

`gguf.GGUFReader` turns every metadata value into numpy views, which for a tokenizer of 49k tokens
and merges costs seconds and ~150 MB held for the life of the reader: more than a third of
SmolLM2's layers. A stage only needs the tensor index, so we walk the header the way the GGUF spec
lays it out (magic, version, counts; key/value pairs; tensor infos; aligned data), keeping scalar
and string values and short arrays of numbers (`arrays`: per-layer settings such as
`sliding_window_pattern`), skipping the rest, and slicing tensor bytes out of one `mmap` on demand.
The `gguf` package still does the dequantizing.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType

from mohawk_common.errors import ModelLoadError

# GGUF value types: struct formats of the fixed-size scalars; 8 is STRING, 9 is ARRAY.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
MAX_KEPT_ARRAY = 4096  # arrays of numbers up to this length are kept (a layer count); longer skipped
MetadataValue = int | float | bool | str


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file: `shape` in numpy (row-major, HF) order, bytes from `offset`."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFFile:
    """A memory-mapped GGUF file; tensor bytes are read only when `raw` slices them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as handle:
                if path.stat().st_size == 0:
                    raise ValueError("not a GGUF file: it is empty")
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            self.metadata, self.arrays, self.tensors = _parse(self._map)
        except (OSError, ValueError, KeyError, struct.error, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc

    def release(self, info: GGUFTensorInfo) -> None:
        """Drop a tensor's pages from this process's memory (a loader that has repacked it is done
        with them): they stay in the page cache, and a later `raw` faults them back in."""
        start = info.offset - info.offset % mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, start, info.offset + info.nbytes - start)

    def raw(self, info: GGUFTensorInfo) -> np.ndarray:
        """A tensor's bytes as a read-only uint8 array of shape [rows, bytes per row] (no copy)."""
        data = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        rows = int(np.prod(info.shape[:-1], dtype=np.int64))
        return data.reshape(rows, info.nbytes // max(rows, 1))


@functools.cache
def can_dequantize(tensor_type: GGMLQuantizationType) -> bool:
    """Whether the `gguf` package dequantizes `tensor_type` (it names some types it cannot read,
    Q8_1 and Q8_K say): tried on one block of zeros."""
    from gguf.quants import dequantize

    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[tensor_type][1]), dtype=np.uint8), tensor_type)
    except NotImplementedError:
        return False
    return True


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.pos = buffer, 0

    def unpack(self, fmt: str) -> int | float | bool:
        self._need(struct.calcsize(fmt))
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = int(self.unpack("<Q"))
        self._need(size)
        self.pos += size
        return self.buffer[self.pos - size : self.pos].decode("utf-8")

    def skip_strings(self, count: int) -> None:
        """Past `count` strings without decoding them (a vocabulary: 0.1 s for 200k, not 1 s)."""
        length, buffer, pos = _U64.unpack_from, self.buffer, self.pos
        for _ in range(count):
            self._need(8)
            pos = self.pos = pos + 8 + length(buffer, pos)[0]
        self._need(0)

    def _need(self, size: int) -> None:
        if self.pos + size > len(self.buffer):
            raise ValueError(f"the file is truncated: it ends at byte {len(self.buffer)}, inside its header")

    def value(self, value_type: int) -> MetadataValue | tuple[MetadataValue, ...] | None:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:  # the tokenizer's long arrays are skipped: it reads its own
            item_type, count = int(self.unpack("<I")), int(self.unpack("<Q"))
            if item_type in _SCALARS and count <= MAX_KEPT_ARRAY:
                return tuple(self.unpack(_SCALARS[item_type]) for _ in range(count))
            if item_type in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item_type])
            elif item_type == _STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item_type)
            return None
        if value_type not in _SCALARS:
            raise ValueError(f"unknown metadata value type {value_type}")
        return self.unpack(_SCALARS[value_type])


def _parse(
    buffer: mmap.mmap,
) -> tuple[dict[str, MetadataValue], dict[str, tuple[MetadataValue, ...]], dict[str, GGUFTensorInfo]]:
    cursor = _Cursor(buffer)
    if len(buffer) < 4 or cursor.unpack("<I") != GGUF_MAGIC:
        raise ValueError(f"not a GGUF file: it starts with {bytes(buffer[:4])!r}, a GGUF file with b'GGUF'")
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    num_tensors, num_metadata = int(cursor.unpack("<Q")), int(cursor.unpack("<Q"))
    metadata: dict[str, MetadataValue] = {}
    arrays: dict[str, tuple[MetadataValue, ...]] = {}
    for _ in range(num_metadata):
        key = cursor.string()
        value = cursor.value(int(cursor.unpack("<I")))
        if isinstance(value, tuple):
            arrays[key] = value
        elif value is not None:
            metadata[key] = value
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = [int(cursor.unpack("<Q")) for _ in range(int(cursor.unpack("<I")))]
        tensor_type = _tensor_type(name, int(cursor.unpack("<I")))
        infos.append((name, tensor_type, tuple(reversed(dims)), int(cursor.unpack("<Q"))))
    alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, tensor_type, shape, offset in infos:
        nbytes = _tensor_nbytes(name, tensor_type, shape)
        begin, end = data_start + offset, data_start + offset + nbytes
        if end > len(buffer):
            raise ValueError(
                f"the file is truncated: tensor {name} ({tensor_type.name} {list(shape)}) needs bytes "
                f"{begin}-{end}, the file has {len(buffer)}"
            )
        tensors[name] = GGUFTensorInfo(name, tensor_type, shape, begin, nbytes)
    return metadata, arrays, tensors


def _tensor_type(name: str, value: int) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(value)
    except ValueError:
        known = ", ".join(t.name for t in GGMLQuantizationType)
        raise ValueError(f"tensor {name} has unknown quantization type {value} (known: {known})") from None


def _tensor_nbytes(name: str, tensor_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor: whole blocks of its type along its rows, or ValueError naming it."""
    if tensor_type not in GGML_QUANT_SIZES:
        raise ValueError(f"tensor {name} has type {tensor_type.name}, whose block size is unknown")
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    if (shape[-1] if shape else 1) % block_size:
        raise ValueError(
            f"tensor {name} has shape {list(shape)}: its rows are not whole {tensor_type.name} "
            f"blocks of {block_size} values"
        )
    return int(np.prod(shape, dtype=np.int64)) // block_size * type_size
