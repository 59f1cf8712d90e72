"""Fixtures for engine tests: the bundled model, its transformers reference, engine builders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from mohawk_common.kv_groups import model_kv_groups
from mohawk_common.model_store import ModelSource, open_model
from mohawk_shard.backends import make_backend
from mohawk_shard.config import EngineSettings
from mohawk_shard.engine.backend import Backend
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.local import build_local_engine, layer_ranges
from mohawk_shard.model.forward_batch import ForwardBatch


@pytest.fixture(scope="session")
def bundled() -> ModelSource:
    return open_model(None)


@pytest.fixture(scope="session")
def reference(hf_reference_model: Any) -> Any:
    """Hugging Face transformers running the same GGUF weights in one process: the reference."""
    return hf_reference_model


@pytest.fixture(scope="session")
def engine_factory(bundled: ModelSource) -> Callable[..., LLMEngine]:
    def make(
        split: Sequence[int] = (),
        source: ModelSource | None = None,
        backends: Sequence[str] = (),
        **settings: Any,
    ) -> LLMEngine:
        # the default settings (batch invariant: texts compare exactly across batch shapes); a test
        # against transformers' fp32 reference pins weights="fp32"
        settings.setdefault("num_kv_blocks", 1024)
        return build_local_engine(EngineSettings(**settings), split, source or bundled, backends)

    return make


def full_logits(
    source: ModelSource,
    token_ids: list[int],
    split: Sequence[int] = (),
    block_size: int = 16,
    backends: Sequence[str] = (),
    weights: str = "fp32",
) -> torch.Tensor:
    """Logits at every position of one prompt, through stages built from `split` (on `backends`,
    default torch; hidden states cross between backends as raw bytes, as on the wire). `weights`
    fp32 (default) is the dequantized path transformers computes too, and the KV cache is held in
    fp32 as transformers holds it (a CPU stage's default is fp16)."""
    ranges = layer_ranges(source.config.num_layers, split)
    num_blocks = -(-len(token_ids) // block_size)
    num_groups = len(model_kv_groups(source.config))  # a table per KV group, each its own ids
    tables = [list(range(g * num_blocks, (g + 1) * num_blocks)) for g in range(num_groups)]
    batch = ForwardBatch.build(
        [(token_ids, 0, tables[0], True)], block_size, all_logits=True, group_tables=[tables[1:]]
    )
    hidden: Any = None
    previous: Backend | None = None
    for (start, end), name in zip(ranges, backends or ["torch"] * len(ranges), strict=True):
        backend = make_backend(
            name, source, start, end, device="cpu", dtype="float32", weights=weights, kv_cache_dtype="float32"
        )
        backend.allocate_kv_cache(num_groups * num_blocks, block_size)
        if previous is not None and previous.name != backend.name:
            hidden = backend.decode_hidden(*previous.encode_hidden(hidden))
        hidden = backend.forward(batch, hidden)
        previous = backend
    assert previous is not None
    if previous.name != "torch":
        hidden = torch.from_numpy(np.array(hidden, copy=True))
    return hidden


def reference_logits(model: Any, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


def reference_greedy(
    model: Any, token_ids: list[int], max_new_tokens: int, eos: int | list[int] | None = None
) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([token_ids]),
            attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if isinstance(eos, int) else None,
        )
    return out[0, len(token_ids) :].tolist()
