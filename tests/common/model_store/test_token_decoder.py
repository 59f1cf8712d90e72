"""A GGUF opened before starts a stage without transformers: its `ModelConfig` comes from the cache
(and equals the one derived through transformers), and `load_decoder` decodes through the
`tokenizers` package exactly as transformers' tokenizer does, loading that tokenizer only when
something else is asked of it. Each check runs in a fresh process, as a node starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import open_model
from mohawk_common.model_store.gguf_cache import cached_model_config, entry_dir
from mohawk_common.model_store.store import bundled_model_path
from mohawk_common.model_store.token_decoder import LazyTokenizer

MESSAGES = [{"role": "user", "content": "Héllo wörld 日本語 😊"}]
_CHILD = """
import json, sys
from mohawk_common.chat import encode_chat
from mohawk_common.model_store import open_model
source = open_model(sys.argv[1])
decoder = source.load_decoder()
ids = json.loads(sys.argv[2])
texts = [decoder.decode(ids, skip_special_tokens=skip) for skip in (False, True)]
print(json.dumps({"transformers": "transformers" in sys.modules, "layers": source.config.num_layers,
                  "texts": texts, "lazy": type(decoder).__name__}))
"""


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOHAWK_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "model.gguf"
    shutil.copyfile(bundled_model_path(), copy)
    return copy


def _child(gguf: Path, ids: list[int]) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(gguf), json.dumps(ids)],
        capture_output=True, text=True, check=True, env=dict(os.environ), timeout=120,
    )  # fmt: skip
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_second_process_starts_without_transformers(gguf: Path) -> None:
    first = open_model(gguf)
    tokenizer = first.load_tokenizer()  # the first process reads through transformers, and keeps it
    assert cached_model_config(gguf) == first.config
    ids = [int(i) for i in np.random.default_rng(0).integers(0, first.config.vocab_size, 300)]
    ids[5:5] = [tokenizer.bos_token_id, tokenizer.eos_token_id]  # special tokens, skipped or not
    second = _child(gguf, ids)
    assert second["transformers"] is False and second["lazy"] == "LazyTokenizer"
    assert second["layers"] == first.config.num_layers
    assert second["texts"] == [tokenizer.decode(ids, skip_special_tokens=s) for s in (False, True)]


def test_the_lazy_tokenizer_loads_transformers_for_anything_else(gguf: Path) -> None:
    source = open_model(gguf)
    full = source.load_tokenizer()
    loads: list[int] = []

    def load() -> object:
        loads.append(1)
        return full

    lazy = LazyTokenizer(entry_dir(gguf, "tokenizer"), load)
    assert lazy.decode([1, 2, 3]) == full.decode([1, 2, 3]) and not loads
    assert lazy.chat_template == full.chat_template and loads == [1]
    assert lazy.encode("Hello") == full.encode("Hello") and loads == [1]  # loaded once
    assert encode_chat(lazy, MESSAGES) == encode_chat(full, MESSAGES)  # calling it, as encode_chat does
    assert len(lazy) == len(full)


def test_a_damaged_or_missing_entry_reads_the_file_again(gguf: Path) -> None:
    config = open_model(gguf).config
    entry = entry_dir(gguf, "model-config") / "model-config.json"
    entry.write_text("{not json")
    assert cached_model_config(gguf) is None
    assert open_model(gguf).config == config
    assert cached_model_config(gguf) == config  # kept again
    shutil.rmtree(entry_dir(gguf, "tokenizer"), ignore_errors=True)
    assert not isinstance(open_model(gguf).load_decoder(), LazyTokenizer)  # transformers reads it
    assert isinstance(open_model(gguf).load_decoder(), LazyTokenizer)  # and kept it


def test_the_decoder_is_read_on_its_own_thread_and_decode_waits_for_it(
    gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the lazy tokenizer returns while `tokenizers` still reads its file (beside the
    weights' load, at a node's start); the first `decode` waits for it and decodes through it."""
    import threading

    from mohawk_common.model_store import token_decoder

    release, real = threading.Event(), token_decoder._decoder
    monkeypatch.setattr(token_decoder, "_decoder", lambda folder: release.wait(30) and real(folder))
    full = open_model(gguf).load_tokenizer()
    lazy = LazyTokenizer(entry_dir(gguf, "tokenizer"), lambda: pytest.fail("transformers was loaded"))
    assert lazy._fast_loaded.is_alive()  # still reading
    threading.Timer(0.2, release.set).start()
    assert lazy.decode([1, 2, 3]) == full.decode([1, 2, 3]) and not lazy._fast_loaded.is_alive()
