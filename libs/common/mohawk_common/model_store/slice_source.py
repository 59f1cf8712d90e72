"""A model source built from one opened slice package: a layer range, no model files on disk.

`slice_weights` turns a layer range of any `ModelSource` into the manifest fields and the
safetensors bytes of a slice package (float32 tensors under canonical names), with everything a
stage needs besides weights: the `ModelConfig`, the transformers config as a dict, and the
tokenizer's own files (as `save_pretrained` writes them, base64). `SliceSource` rebuilds those and
serves `load_weights` for ranges inside the slice only. libs/pqc signs, seals and verifies the
package; `open_slice_source` is the one call that does both halves.
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
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD, ModelSource, one_line

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from mohawk_pqc.certificates import TrustStore
    from mohawk_pqc.identity import Identity
    from mohawk_pqc.slices import SlicePackage

MODEL_CONFIG_FIELD = "model_config"
HF_CONFIG_FIELD = "hf_config"
TOKENIZER_FIELD = "tokenizer_files"
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
    loaded = source.load_weights(start, end, embedding=embedding, head=head)
    tensors = {_stored_name(config, name): array for name, array in loaded.items()}
    fields: dict[str, Any] = {
        "model_id": config.model_id,
        "layer_start": start,
        "layer_end": end,
        "embedding": embedding,
        "head": head,
        "tensors": [
            {"name": name, "shape": list(array.shape), "dtype": "F32"} for name, array in tensors.items()
        ],
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

    @classmethod
    def from_slice(cls, manifest: Mapping[str, Any], weights: bytes) -> SliceSource:
        """Build from an opened package: its (verified) manifest and plaintext safetensors bytes."""
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            config = ModelConfig.model_validate(manifest[MODEL_CONFIG_FIELD])
            hf_config = _hf_config_from_dict(manifest[HF_CONFIG_FIELD])
            start, end = int(manifest["layer_start"]), int(manifest["layer_end"])
            expected = {t["name"]: tuple(t["shape"]) for t in manifest["tensors"]}
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ModelLoadError(f"the slice package is not a usable model slice: {one_line(exc)}") from exc
        try:
            tensors = load(weights)
        except SafetensorError as exc:
            raise ModelLoadError(f"the slice weights are not a safetensors file: {one_line(exc)}") from exc
        if not 0 <= start < end <= config.num_layers:
            raise ModelLoadError(f"slice layer range [{start}, {end}) does not fit {config.model_id}")
        actual = {name: array.shape for name, array in tensors.items()}
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

    def _read_tensor(self, name: str) -> np.ndarray:
        array = self._tensors.get(name)
        if array is None:
            raise ModelLoadError(f"the slice of {self.config.model_id} has no tensor {name}")
        return array

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


def _stored_name(config: ModelConfig, name: str) -> str:
    # A tied head *is* the embedding matrix; `load_weights` reads it under the embedding's name.
    return EMBEDDING if name == LM_HEAD and config.tie_word_embeddings else name


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
