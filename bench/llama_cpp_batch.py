"""llama.cpp serving many sequences at once, through llama-cpp-python's low-level API (its `Llama`
class runs one): the side bench/architectures.py sets against Mohawk's 32-stream throughput, and the
logits of every position of one sequence for its teacher-forced comparison.

Design. One context with `n_seq_max` sequences over a unified KV cache, as llama.cpp's own
`batched` example runs them: every prompt goes in as one sequence id (prompts packed into batches of
`n_batch` tokens, logits asked for on each prompt's last token only), then each step decodes one
token of every live sequence in a single `llama_decode`, the next token the argmax of its logits
(greedy, EOS not stopping, as Mohawk's `ignore_eos`). The KV cache is cleared before each run.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class LlamaCppBatch:
    def __init__(self, path: Path, num_threads: int, num_seqs: int = 32, n_ctx: int = 8192) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._lib = llama_cpp
        self.model = llama_cpp.Llama(
            model_path=str(path), n_ctx=256, n_threads=num_threads, vocab_only=False, verbose=False
        )
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
        params.n_seq_max, params.kv_unified = num_seqs, True
        params.n_threads = params.n_threads_batch = num_threads
        self.n_batch = 512
        self.ctx = _internals.LlamaContext(model=self.model._model, params=params, verbose=False)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, num_seqs)
        self.num_vocab = self.model.n_vocab()

    def close(self) -> None:
        self._lib.llama_batch_free(self.batch)
        self.ctx.close()
        self.model.close()

    def _decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """One `llama_decode` of `(token, position, sequence, wants logits)` entries."""
        batch = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(entries)
        status = self._lib.llama_decode(self.ctx.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def _logits(self, index: int) -> np.ndarray[Any, Any]:
        pointer = self._lib.llama_get_logits_ith(self.ctx.ctx, index)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (self.num_vocab,))

    def _clear(self) -> None:
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self.ctx.ctx), True)

    def all_logits(self, tokens: Sequence[int]) -> np.ndarray[Any, Any]:
        """[len(tokens), vocab] float32: the logits after each token of one sequence."""
        self._clear()
        rows = []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            self._decode([(t, start + i, 0, True) for i, t in enumerate(chunk)])
            rows.extend(self._logits(i).copy() for i in range(len(chunk)))
        return np.stack(rows)

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """Every prompt as its own sequence; returns the batch index holding each prompt's last logits,
        read as each packed batch is decoded (a later decode overwrites them)."""
        first: list[int] = []
        entries: list[tuple[int, int, int, bool]] = []
        for seq, prompt in enumerate(prompts):
            if len(entries) + len(prompt) > self.n_batch:
                first += self._flush(entries)
                entries = []
            entries += [(t, i, seq, i == len(prompt) - 1) for i, t in enumerate(prompt)]
        return first + self._flush(entries)

    def _flush(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        self._decode(entries)
        return [int(self._logits(i).argmax()) for i, entry in enumerate(entries) if entry[3]]

    def concurrent(self, prompts: Sequence[Sequence[int]], num_tokens: int) -> float:
        """Aggregate output tokens/s of `prompts` decoded together, `num_tokens` each, prefill included."""
        self._clear()
        start = time.perf_counter()
        tokens = self._prefill(prompts)
        positions = [len(p) for p in prompts]
        for _ in range(num_tokens - 1):
            self._decode([(t, positions[s], s, True) for s, t in enumerate(tokens)])
            tokens = [int(self._logits(s).argmax()) for s in range(len(prompts))]
            positions = [p + 1 for p in positions]
        return len(prompts) * num_tokens / (time.perf_counter() - start)
