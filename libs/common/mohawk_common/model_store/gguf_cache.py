"""What transformers derives from a GGUF file's metadata, kept on disk for the next process.

Design. transformers reads a GGUF's config and tokenizer through gguf-py, which walks every element
of every metadata array in Python: for the bundled model's 49,152-token vocabulary that is about
5 s for the config and 3.4 s for the tokenizer on our 2-core machine, paid again by every process
that opens the file (each shard node, the gateway, each `mohawk generate`), all at once when a
cluster starts. What it derives is plain files transformers reloads in a fraction of that: the
config's `config.json` and the fast tokenizer's own files (vocabulary, merges, chat template). So
the first process to open a file keeps them, under a key of the file's resolved path, size and
modification time and transformers' version (a changed file or library is a new entry), in
`MOHAWK_CACHE_DIR` (default `$XDG_CACHE_HOME/mohawk` or `~/.cache/mohawk`), below `gguf/`. An
entry is written to a temporary folder and renamed into place, so processes starting together
never read half of one; where the folder cannot be written, nothing is kept and each process
reads the file as before. transformers stays the one reader of the format: the cache holds its
output, never a second interpretation of the metadata.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from mohawk_common.env_knobs import env_knob

if TYPE_CHECKING:
    from mohawk_common.model_store.config import ModelConfig

log = structlog.get_logger("mohawk.model_store.gguf_cache")

_FORMAT = 1  # bump when what an entry holds changes
CACHE_DIR_ENV = env_knob(
    "MOHAWK_CACHE_DIR",
    "$XDG_CACHE_HOME/mohawk or ~/.cache/mohawk",
    "the GGUF load cache (repacked tensors, below gguf/): shared by the nodes and `mohawk generate`",
)
_MODEL_ID = "mohawk-model-id.json"
_MODEL_CONFIG = "model-config"


def cache_root() -> Path:
    """Where entries live: MOHAWK_CACHE_DIR, else the user's cache folder."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured) / "gguf"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mohawk" / "gguf"


def entry_dir(path: Path, what: str) -> Path:
    """The entry of `what` ("config", "tokenizer" or "model-config") for the GGUF file at `path`
    as it is now (transformers' version read from its metadata: no import)."""
    stat = path.stat()
    version = importlib.metadata.version("transformers")
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{version}|{_FORMAT}|{_derivation_digest()}"
    return cache_root() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}-{what}"


def cached_config(path: Path, read: Callable[[], Any]) -> tuple[Any, str | None]:
    """transformers' config of the GGUF at `path` and the model id it named (`_model_name_or_path`):
    from the cache, or `read()` and kept."""
    from transformers import AutoConfig

    entry = entry_dir(path, "config")
    if (entry / "config.json").is_file():
        try:
            model_id = json.loads((entry / _MODEL_ID).read_text())["model_id"]
            config = AutoConfig.from_pretrained(str(entry), local_files_only=True)
            config._name_or_path = str(path.parent)  # as transformers names it from the file
            return config, model_id
        except Exception as exc:  # a damaged entry: read the file again and replace it
            log.warning("cached GGUF config unreadable: reading the file", entry=str(entry), error=repr(exc))
    config = read()
    model_id = getattr(config, "_model_name_or_path", None)

    def write(folder: Path) -> None:
        config.save_pretrained(str(folder))
        (folder / _MODEL_ID).write_text(json.dumps({"model_id": model_id}))

    _keep(entry, write)
    return config, model_id


@functools.cache
def _derivation_digest() -> str:
    """A digest of the modules that derive a `ModelConfig` from a GGUF: an edit to them is a new
    entry, so a cached config never outlives the code that made it."""
    here = Path(__file__).parent
    sources = ("config.py", "gguf_config.py", "gguf_source.py")
    return hashlib.sha256(b"".join((here / name).read_bytes() for name in sources)).hexdigest()[:16]


def cached_model_config(path: Path) -> ModelConfig | None:
    """Mohawk's own config of the GGUF at `path`, where a process that opened it before kept it
    (`keep_model_config`): what a stage, the gateway and the coordinator need, with no
    transformers import. None where there is no readable entry."""
    from mohawk_common.model_store.config import ModelConfig

    entry = entry_dir(path, _MODEL_CONFIG)
    try:
        return ModelConfig.model_validate_json((entry / "model-config.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # damaged: dropped, so that the next keep replaces it
        log.warning("cached model config unreadable: reading the file", entry=str(entry), error=repr(exc))
        shutil.rmtree(entry, ignore_errors=True)
        return None


def keep_model_config(path: Path, config: ModelConfig) -> None:
    """Keep `config` for the next process that opens the GGUF at `path`."""
    text = config.model_dump_json()

    def write(folder: Path) -> None:
        (folder / "model-config.json").write_text(text)

    _keep(entry_dir(path, _MODEL_CONFIG), write)


def cached_tokenizer(path: Path, read: Callable[[], Any]) -> Any:
    """transformers' tokenizer of the GGUF at `path`: from the cache, or `read()` and kept."""
    from transformers import AutoTokenizer

    entry = entry_dir(path, "tokenizer")
    if (entry / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
        except Exception as exc:
            log.warning(
                "cached GGUF tokenizer unreadable: reading the file", entry=str(entry), error=repr(exc)
            )
    tokenizer = read()
    _keep(entry, lambda folder: tokenizer.save_pretrained(str(folder)))
    return tokenizer


def _keep(entry: Path, write: Callable[[Path], None]) -> None:
    """Write an entry beside its place and rename it there; any failure keeps nothing."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as exc:
        log.info("GGUF metadata cache not writable: not kept", folder=str(entry.parent), error=str(exc))
        return
    try:
        write(folder)
        folder.rename(entry)  # atomic; fails if another process put the entry there first
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
    except Exception as exc:
        shutil.rmtree(folder, ignore_errors=True)
        log.warning("GGUF metadata not kept", entry=str(entry), error=str(exc))
