"""The GGUF metadata cache: a second process's config and tokenizer come from the cache and equal
what transformers read from the file; a changed file, a damaged entry and an unwritable cache
folder each fall back to reading the file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from mohawk_common.chat import encode_chat
from mohawk_common.model_store import open_model
from mohawk_common.model_store.gguf_cache import cached_config, cached_tokenizer, entry_dir
from mohawk_common.model_store.store import bundled_model_path

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo wörld 日本語 <|im_start|> 😊 and\ttabs  spaces"},
]


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the bundled GGUF, and an empty cache folder of this test's own."""
    monkeypatch.setenv("MOHAWK_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "model.gguf"
    shutil.copyfile(bundled_model_path(), copy)
    return copy


def _unreachable() -> Any:
    raise AssertionError("the file was read again instead of the cache")


def test_a_second_open_reads_the_cache_and_gets_the_same_config_and_tokenizer(gguf: Path) -> None:
    first = open_model(gguf)
    first_tokenizer = first.load_tokenizer()
    assert (entry_dir(gguf, "config") / "config.json").is_file()
    assert (entry_dir(gguf, "tokenizer") / "tokenizer_config.json").is_file()

    config, model_id = cached_config(gguf, _unreachable)
    tokenizer = cached_tokenizer(gguf, _unreachable)
    second = open_model(gguf)
    assert second.config == first.config
    assert model_id == first.config.model_id == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert config.to_diff_dict() == first.hf_config.to_diff_dict()
    assert encode_chat(tokenizer, MESSAGES) == encode_chat(first_tokenizer, MESSAGES)
    assert tokenizer.chat_template == first_tokenizer.chat_template
    assert tokenizer.all_special_tokens == first_tokenizer.all_special_tokens
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (
        first_tokenizer.bos_token_id,
        first_tokenizer.eos_token_id,
    )
    assert len(tokenizer) == len(first_tokenizer)


def test_a_changed_file_is_a_new_entry(gguf: Path) -> None:
    hf_config = open_model(gguf).hf_config
    before = entry_dir(gguf, "config")
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert entry_dir(gguf, "config") != before
    reads: list[int] = []

    def read() -> Any:
        reads.append(1)
        return hf_config

    assert cached_config(gguf, read)[0] is hf_config and reads == [1]
    assert cached_config(gguf, _unreachable)[1] == "Smollm2 135M 8k Lc100K Mix1 Ep2"  # kept anew


def test_a_damaged_entry_is_read_again_and_replaced(gguf: Path) -> None:
    source = open_model(gguf)
    entry = entry_dir(gguf, "config")
    (entry / "config.json").write_text("{not json")
    assert open_model(gguf).config == source.config  # read from the file again


def test_an_unwritable_cache_folder_keeps_nothing_and_still_opens(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MOHAWK_CACHE_DIR", str(blocker))
    source = open_model(gguf)
    assert source.config.num_layers == 30 and source.load_tokenizer() is not None
    assert blocker.read_text() == "not a folder"
