"""A model's tokenizer as a shard needs it: token ids to text through the `tokenizers` package at
once, everything else (chat templates, encoding) from transformers' tokenizer on first use.

Design. A stage that samples only turns ids into text (`detokenizer.py`), yet loading transformers'
tokenizer for it cost about 3 s of a 1.7B model's start on 2 cores, most of it importing
transformers. A GGUF file opened before has transformers' fast tokenizer kept as plain files
(`gguf_cache.py`), among them the `tokenizers` package's own `tokenizer.json`: `tokenizers` runs
it directly, and transformers' fast tokenizer decodes through the very same object (plus an
optional space clean-up, which a kept `tokenizer_config.json` says is wanted or not; where it
is, this falls back to transformers for decoding too). `LazyTokenizer` serves `decode` so and
loads transformers' tokenizer the first time anything else is asked of it, so callers that also
encode chats (`mohawk generate`) see the same object as before. The `tokenizers` file is read on a
thread of its own, beside the weights' load (`tokenizers` lets go of the GIL for most of it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class LazyTokenizer:
    """`decode` by `tokenizers` from a kept `tokenizer.json`; any other attribute from
    transformers' tokenizer, loaded (once) by `load_full` on first use."""

    def __init__(self, folder: Path | None, load_full: Callable[[], Any]) -> None:
        self._fast_result: list[Any] = []
        # read in the background: a 262k-token vocabulary takes `tokenizers` a second or two, which
        # the weights' load (and the first prompt) overlap; `decode` waits for it
        self._fast_loaded = threading.Thread(
            target=lambda: self._fast_result.append(None if folder is None else _decoder(folder)),
            name="tokenizer-load",
            daemon=True,
        )
        self._fast_loaded.start()
        self._load_full = load_full
        self._full: Any = None
        self._lock = threading.Lock()

    @property
    def _fast(self) -> Any:
        """The `tokenizers` decoder (None where decoding needs transformers), once it is read."""
        self._fast_loaded.join()
        return self._fast_result[0] if self._fast_result else None

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False, **kwargs: Any) -> str:
        fast = self._fast
        if fast is None or kwargs:
            return str(self.full.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs))
        return str(fast.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    @property
    def full(self) -> Any:
        """transformers' tokenizer of the model."""
        with self._lock:
            if self._full is None:
                self._full = self._load_full()
            return self._full

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)

    # special methods are looked up on the type, not through __getattr__
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.full(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.full)


def _decoder(folder: Path) -> Any:
    """The `tokenizers` tokenizer kept in `folder`, or None where its decoding needs transformers
    (a clean-up of spaces) or nothing readable is there."""
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        if settings.get("clean_up_tokenization_spaces"):
            return None
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    except (OSError, ValueError, Exception):
        return None
