"""The sides bench/engine.py measures: Mohawk's in-process engine (one per weight format),
transformers, and llama.cpp (through llama-cpp-python, when installed: `pip install 'mohawk[bench]'`).

Every runner answers `batch1(prompt, num_tokens) -> (time to first token s, decode tokens/s)` on the
same prompt token ids, greedy, running to exactly `num_tokens` whatever it samples (EOS does not stop
it); runners that batch also answer `concurrent(prompts, num_tokens) -> aggregate tokens/s`.
Decode tokens/s is the tokens after the first over the time after the first, on every side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.gguf_source import GGUFSource
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD, weight_names
from mohawk_shard.config import EngineSettings, WeightsMode
from mohawk_shard.engine.llm_engine import LLMEngine
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.local import build_local_engine

LLAMA_CPP_MISSING = "llama-cpp-python not installed: pip install 'mohawk[bench]'"


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class StageMemory:
    """Weights one stage holds against the bytes the GGUF file stores for the same tensors."""

    layers: str
    held_bytes: int
    gguf_bytes: int | None  # None when the model is not a GGUF file

    @property
    def ratio(self) -> float | None:
        return None if not self.gguf_bytes else self.held_bytes / self.gguf_bytes


def stage_memory(engine: LLMEngine, source: ModelSource) -> list[StageMemory]:
    """Per stage: `weight_bytes` against the file's tensor bytes for its layers (a tied head is the
    embedding tensor, counted once per stage)."""
    stages = []
    for stage in engine.stages:
        backend = stage.backend
        gguf_bytes = None
        if isinstance(source, GGUFSource):
            names = weight_names(
                source.config,
                backend.start,
                backend.end,
                embedding=backend.has_embedding,
                head=backend.has_head,
            )
            tied = source.config.tie_word_embeddings
            # the file's tensor of each (Gemma's norms, Phi-3's fused q/k/v and gate/up, 3-D experts)
            gguf_names = {source._info(EMBEDDING if tied and n == LM_HEAD else n).name for n in names}
            gguf_bytes = sum(source._file.tensors[n].nbytes for n in gguf_names)
        layers = f"[{backend.start}, {backend.end})"
        stages.append(StageMemory(layers, backend.weight_bytes, gguf_bytes))
    return stages


class MohawkRunner:
    supports_concurrent = True

    def __init__(self, settings: EngineSettings, source: ModelSource) -> None:
        self.name = f"mohawk-{settings.weights}"
        self.weights: WeightsMode = settings.weights
        rss_before = rss_bytes()
        self.engine = build_local_engine(settings, (), source)
        self.rss_after_load = rss_bytes()
        self.rss_delta = self.rss_after_load - rss_before
        self.memory = stage_memory(self.engine, source)

    def batch1(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        start = time.perf_counter()
        self.engine.add_request("b1", prompt, params)
        first = last = 0.0
        for event in self.engine.run():
            last = time.perf_counter()
            if event.index == 0:
                first = last
        return first - start, (num_tokens - 1) / (last - first)

    def concurrent(self, prompts: list[list[int]], num_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        elapsed = timed(lambda: self.engine.generate(prompts, params))
        return len(prompts) * num_tokens / elapsed


class TransformersRunner:
    name = "transformers"
    supports_concurrent = True

    def __init__(self, source: ModelSource, device: torch.device, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {"dtype": dtype}
        if source.path.suffix == ".gguf":
            kwargs["gguf_file"] = source.path.name
            directory = source.path.parent
        else:
            directory = source.path
        model: Any = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
        self.model = model.to(device).eval()
        self.model.generation_config.eos_token_id = None  # run to max_new_tokens, like ignore_eos
        self.model.generation_config.pad_token_id = 0
        self.device = device

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> None:
        with torch.inference_mode():
            self.model.generate(ids, attention_mask=mask, max_new_tokens=num_tokens, do_sample=False)

    def batch1(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        ids = torch.tensor([prompt], device=self.device)
        mask = torch.ones_like(ids)
        ttft = timed(lambda: self._generate(ids, mask, 1))
        total = timed(lambda: self._generate(ids, mask, num_tokens))
        return ttft, (num_tokens - 1) / (total - ttft)

    def concurrent(self, prompts: list[list[int]], num_tokens: int) -> float:
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding, as batched generation needs
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        elapsed = timed(lambda: self._generate(ids, mask, num_tokens))
        return len(prompts) * num_tokens / elapsed


def llama_cpp_version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.__version__)


class LlamaCppRunner:
    """llama.cpp on the same GGUF file, fed the same token ids, one sequence (no concurrent form).

    Each run starts from `reset()` (no prompt reuse), evaluates the prompt in batches of 512, then
    one token at a time; the next token is the argmax of the last logits, EOS included and not
    stopping, as Mohawk's `ignore_eos`.
    """

    name = "llama.cpp"
    supports_concurrent = False

    def __init__(self, path: Path, num_threads: int) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        rss_before = rss_bytes()
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_threads=num_threads,
            n_threads_batch=num_threads,
            n_ctx=2048,
            n_batch=512,
            verbose=False,
        )
        self.rss_after_load = rss_bytes()
        self.rss_delta = self.rss_after_load - rss_before
        self.num_vocab = self.llm.n_vocab()

    def _next_token(self) -> int:
        logits = self._llama_cpp.llama_get_logits(self.llm.ctx)
        return int(np.ctypeslib.as_array(logits, shape=(self.num_vocab,)).argmax())

    def batch1(self, prompt: list[int], num_tokens: int) -> tuple[float, float]:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt)
        token = self._next_token()
        first = time.perf_counter()
        for _ in range(num_tokens - 1):
            self.llm.eval([token])
            token = self._next_token()
        return first - start, (num_tokens - 1) / (time.perf_counter() - first)

    def concurrent(self, prompts: list[list[int]], num_tokens: int) -> float:
        raise NotImplementedError("llama-cpp-python runs one sequence")
