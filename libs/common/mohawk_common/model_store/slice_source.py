"""A model source built from one opened slice package: a layer range, no model files on disk.

`slice_weights` turns a layer range of any `ModelSource` into the manifest fields and the
safetensors bytes of a slice package, with everything a stage needs besides weights: the
`ModelConfig`, the transformers config as a dict, and the tokenizer's own files (as
`save_pretrained` writes them, base64). A tensor the source stores in a GGUF block format the
kernels read (`DECODABLE_FORMATS`) travels as those blocks, byte for byte (uint8 [rows, bytes a
row], rows already in HF order, a fused tensor's part cut out), its manifest entry naming the
format; F16 travels as F16 and anything else as float32. So a package is about its layers' size
in the file, and `SliceSource` answers `stored_format`, `read_blocks` and `read_quantized` as the
file would: a node serving from slices builds the same kernels and holds the same bytes as one
serving the file. `SliceSource` serves ranges inside the slice only. libs/pqc signs, seals and
verifies the package; `open_slice_source` is the one call that does both halves.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import ModelConfig
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.quantized import DECODABLE_FORMATS, GroupQuantized, StoredBlocks
from mohawk_common.model_store.source import ModelSource, one_line, weight_names

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from mohawk_pqc.certificates import TrustStore
    from mohawk_pqc.identity import Identity
    from mohawk_pqc.slices import SlicePackage

MODEL_CONFIG_FIELD = "model_config"
HF_CONFIG_FIELD = "hf_config"
TOKENIZER_FIELD = "tokenizer_files"
# every tensor of the whole model -> how the file stores it: a node sizes and reports its weights
# (heartbeat, planner) as a node serving the file would, layers it does not hold included
FORMATS_FIELD = "stored_formats"
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16}  # a manifest dtype of a float tensor
BLOCKS_DTYPE = "U8"  # a tensor carried as its file's blocks; its entry's "format" names the type
# Keys of a transformers config that name the packer's own disk, not the model.
_LOCAL_CONFIG_KEYS = ("_name_or_path", "_commit_hash")


def slice_weights(
    source: ModelSource,
    start: int,
    end: int,
    *,
    embedding: bool | None = None,
    head: bool | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Manifest fields and safetensors bytes of layers `[start, end)` of `source`.

    `embedding` defaults to "the range starts at layer 0" and `head` to "it ends at the last
    layer". A tied LM head is stored once, as the embedding matrix. The fields still lack what only
    the packer knows (model revision, served model name, policy tags).
    """
    from safetensors.numpy import save

    config = source.config
    embedding = start == 0 if embedding is None else embedding
    head = end == config.num_layers if head is None else head
    source.check_range(start, end)
    tensors: dict[str, np.ndarray] = {}
    entries: list[dict[str, Any]] = []
    for name in weight_names(config, start, end, embedding=embedding, head=head):
        stored = source.stored_name(name)
        if stored in tensors:
            continue
        array, entry = _packed_tensor(source, stored)
        tensors[stored] = array
        entries.append({"name": stored} | entry)
    fields: dict[str, Any] = {
        "model_id": config.model_id,
        "layer_start": start,
        "layer_end": end,
        "embedding": embedding,
        "head": head,
        "tensors": entries,
        FORMATS_FIELD: {
            stored: source.stored_format(stored)
            for stored in dict.fromkeys(
                source.stored_name(name)
                for name in weight_names(config, 0, config.num_layers, embedding=True, head=True)
            )
        },
        MODEL_CONFIG_FIELD: config.model_dump(mode="json"),
        HF_CONFIG_FIELD: _hf_config_dict(source.hf_config),
        TOKENIZER_FIELD: _tokenizer_files(source.load_tokenizer()),
    }
    return fields, save(tensors)


class SliceSource(ModelSource):
    """The layers, config and tokenizer carried by one verified slice package."""

    stores_fused = False  # a package holds canonical tensors, already split

    def __init__(
        self,
        manifest: Mapping[str, Any],
        config: ModelConfig,
        hf_config: PretrainedConfig,
        tensors: dict[str, np.ndarray],
    ) -> None:
        name = f"slice:{manifest.get('served_model') or config.model_id}/{manifest.get('recipient_node_id')}"
        super().__init__(Path(name), config, hf_config)
        self.manifest = dict(manifest)
        self.layer_start = int(manifest["layer_start"])
        self.layer_end = int(manifest["layer_end"])
        self.has_embedding = bool(manifest["embedding"])
        self.has_head = bool(manifest["head"])
        self._tensors = tensors
        self._entries = {entry["name"]: entry for entry in manifest.get("tensors", ())}

    @classmethod
    def from_slice(cls, manifest: Mapping[str, Any], weights: bytes) -> SliceSource:
        """Build from an opened package: its (verified) manifest and plaintext safetensors bytes."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            config = ModelConfig.model_validate(manifest[MODEL_CONFIG_FIELD])
            hf_config = _hf_config_from_dict(manifest[HF_CONFIG_FIELD])
            start, end = int(manifest["layer_start"]), int(manifest["layer_end"])
            entries = [_checked_entry(t) for t in manifest["tensors"]]
            expected = {e["name"]: (_carried_shape(e), _carried_dtype(e)) for e in entries}
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ModelLoadError(f"the slice package is not a usable model slice: {one_line(exc)}") from exc
        try:
            tensors = load(weights)
        except SafetensorError as exc:
            raise ModelLoadError(f"the slice weights are not a safetensors file: {one_line(exc)}") from exc
        if not 0 <= start < end <= config.num_layers:
            raise ModelLoadError(f"slice layer range [{start}, {end}) does not fit {config.model_id}")
        actual = {name: (array.shape, array.dtype) for name, array in tensors.items()}
        if actual != expected:
            raise ModelLoadError("the slice weights do not hold the tensors its manifest lists")
        return cls(manifest, config, hf_config, tensors)

    def __repr__(self) -> str:
        return (
            f"SliceSource({self.config.model_id!r}, layers [{self.layer_start}, {self.layer_end}), "
            f"embedding={self.has_embedding}, head={self.has_head})"
        )

    def check_holds(self, start: int, end: int) -> None:
        """AuthenticationError (bad_version) unless this slice holds stage [start, end) whole: its
        layers, and the embedding (start 0) and LM head (end at the last layer) with them. A node
        checks what a plan asks before it loads anything."""
        from mohawk_pqc.errors import AuthenticationError
        from mohawk_pqc.slices import check_layers

        check_layers(self.manifest, start, end)
        missing = [
            part
            for part, needed, held in (
                ("the embedding", start == 0, self.has_embedding),
                ("the LM head", end == self.config.num_layers, self.has_head),
            )
            if needed and not held
        ]
        if missing:
            raise AuthenticationError("bad_version", f"the slice lacks {' and '.join(missing)}")

    def load_weights(self, start: int, end: int, *, embedding: bool, head: bool) -> dict[str, np.ndarray]:
        """As `ModelSource.load_weights`, for ranges inside the slice only; the arrays are shared."""
        missing = []
        if not self.layer_start <= start < end <= self.layer_end:
            missing.append(f"layers [{start}, {end})")
        if embedding and not self.has_embedding:
            missing.append("the embedding")
        if head and not self.has_head:
            missing.append("the LM head")
        if missing:
            raise ModelLoadError(
                f"{' and '.join(missing)} of {self.config.model_id} are not in this slice "
                f"(it holds layers [{self.layer_start}, {self.layer_end})"
                f"{', embedding' if self.has_embedding else ''}{', head' if self.has_head else ''})"
            )
        return super().load_weights(start, end, embedding=embedding, head=head)

    def stored_format(self, name: str) -> str:
        """As the file stores `name`, held here or not (a package from before the formats were
        carried says F32, as it held float32)."""
        name = self.stored_name(name)
        entry = self._entries.get(name)
        if entry is not None and "format" in entry:
            return str(entry["format"])
        formats = self.manifest.get(FORMATS_FIELD)
        return str(formats.get(name, "F32")) if isinstance(formats, dict) else "F32"

    def stored_shape(self, name: str) -> tuple[int, ...] | None:
        entry = self._entries.get(self.stored_name(name))
        return None if entry is None else tuple(entry["shape"])

    def read_blocks(self, name: str) -> StoredBlocks | None:
        name = self.stored_name(name)
        entry = self._entry(name)
        if entry["dtype"] != BLOCKS_DTYPE:
            return None
        rows, cols = entry["shape"]
        return StoredBlocks(self._tensors[name], entry["format"], (rows, cols))

    def read_quantized(self, name: str) -> GroupQuantized | None:
        blocks = self.read_blocks(name)
        return None if blocks is None else decode_gguf_blocks(blocks.raw, blocks.type_name, blocks.shape)

    def _entry(self, name: str) -> dict[str, Any]:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelLoadError(f"the slice of {self.config.model_id} has no tensor {name}")
        return entry

    def _read_tensor(self, name: str) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        entry, array = self._entry(name), self._tensors[name]
        if entry["dtype"] != BLOCKS_DTYPE:
            return array
        weights = dequantize(array, GGMLQuantizationType[entry["format"]])
        return weights.reshape(tuple(entry["shape"]))

    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        files = self.manifest.get(TOKENIZER_FIELD)
        if not isinstance(files, dict) or not files:
            raise ModelLoadError("the slice package carries no tokenizer files")
        with tempfile.TemporaryDirectory(prefix="mohawk-slice-tokenizer-") as directory:
            for name, data in files.items():
                if Path(name).name != name or name.startswith("."):
                    raise ModelLoadError(f"the slice package names a bad tokenizer file {name!r}")
                try:
                    (Path(directory) / name).write_bytes(base64.b64decode(data, validate=True))
                except (binascii.Error, TypeError) as exc:
                    raise ModelLoadError(f"tokenizer file {name!r} of the slice is not base64") from exc
            tokenizer: Any = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        return tokenizer


def open_slice_source(
    package: SlicePackage,
    identity: Identity,
    trust: TrustStore,
    *,
    expect_model: str | None = None,
    expect_model_revision: str | None = None,
) -> SliceSource:
    """Verify and decrypt `package` for `identity` (mohawk_pqc.slices.open_slice), then build its source.

    `expect_model` (served model name) and `expect_model_revision` are what the node asks for (None:
    any). Raises `AuthenticationError` when any check fails (nothing is loaded then) and
    `ModelLoadError` when a verified package does not describe a usable slice.
    """
    from mohawk_pqc.slices import open_slice

    manifest, weights = open_slice(
        package,
        identity,
        trust,
        expect_model=expect_model,
        expect_model_revision=expect_model_revision,
    )
    return SliceSource.from_slice(manifest, weights)


def model_fingerprint(source: ModelSource) -> str:
    """A default model revision: a hash of the transformers config and the model files' names and sizes.

    Cheap (no weights are read) and the same on every machine holding the same files; an operator
    who versions models should pass a real revision instead.
    """
    digest = hashlib.sha256(json.dumps(_hf_config_dict(source.hf_config), sort_keys=True).encode())
    files = (
        [source.path] if source.path.is_file() else sorted(p for p in source.path.iterdir() if p.is_file())
    )
    for file in files:
        digest.update(f"\n{file.name}:{file.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def _packed_tensor(source: ModelSource, name: str) -> tuple[np.ndarray, dict[str, Any]]:
    """One tensor as a package carries it, and its manifest entry less the name: the file's blocks
    where the kernels read them, else F16 where the file stores F16, else float32."""
    blocks = source.read_blocks(name)
    if blocks is not None:
        raw = np.array(blocks.raw if blocks.rows is None else blocks.raw[blocks.rows], order="C")
        source.release_blocks(name)
        entry = {"shape": list(blocks.shape), "dtype": BLOCKS_DTYPE, "format": blocks.type_name}
        return raw, entry
    array = source.read_tensor(name)
    stored_format = source.stored_format(name)
    dtype = "F16" if stored_format == "F16" else "F32"
    array = array.astype(FLOAT_DTYPES[dtype], copy=False)
    return array, {"shape": list(array.shape), "dtype": dtype, "format": stored_format}


def _checked_entry(entry: Any) -> dict[str, Any]:
    """A manifest's tensor entry, or ValueError naming what is wrong with it."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError(f"a tensor entry {entry!r} has no name")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"tensor {entry['name']} has no shape")
    dtype = entry.get("dtype")
    if dtype == BLOCKS_DTYPE:
        if entry.get("format") not in DECODABLE_FORMATS or len(shape) != 2:
            raise ValueError(f"tensor {entry['name']} names no block format the kernels read")
    elif dtype not in FLOAT_DTYPES:
        raise ValueError(f"tensor {entry['name']} has dtype {dtype!r}")
    return entry


def _carried_shape(entry: dict[str, Any]) -> tuple[int, ...]:
    """The array shape a package's safetensors holds for a manifest entry."""
    if entry["dtype"] != BLOCKS_DTYPE:
        return tuple(entry["shape"])
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rows, cols = entry["shape"]
    block_weights, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[entry["format"]]]
    if cols % block_weights:
        raise ValueError(f"tensor {entry['name']}: {cols} weights a row are not whole blocks")
    return (rows, cols // block_weights * block_bytes)


def _carried_dtype(entry: dict[str, Any]) -> np.dtype[Any]:
    return np.dtype(np.uint8 if entry["dtype"] == BLOCKS_DTYPE else FLOAT_DTYPES[entry["dtype"]])


def _hf_config_dict(hf_config: PretrainedConfig) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(hf_config.to_json_string(use_diff=False))
    for key in _LOCAL_CONFIG_KEYS:
        data.pop(key, None)
    return data


def _hf_config_from_dict(data: Mapping[str, Any]) -> PretrainedConfig:
    from transformers import AutoConfig

    values = dict(data)
    model_type = values.pop("model_type")
    config: PretrainedConfig = AutoConfig.for_model(model_type, **values)
    return config


def _tokenizer_files(tokenizer: PreTrainedTokenizerBase) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="mohawk-slice-tokenizer-") as directory:
        tokenizer.save_pretrained(directory)
        return {
            path.name: base64.b64encode(path.read_bytes()).decode("ascii")
            for path in sorted(Path(directory).iterdir())
            if path.is_file()
        }
