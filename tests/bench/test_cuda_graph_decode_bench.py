"""`bench/cuda_graph_decode.py`'s model builds and serves without a GPU (the timing itself needs one:
its figures come from a GPU machine, `docs/weights-and-backends.md`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from mohawk_shard.config import EngineSettings
from tests.bench import ROOT


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its modules import their neighbours by name
    return importlib.import_module("cuda_graph_decode"), importlib.import_module("runners")


def test_the_random_model_loads_with_a_tokenizer_and_decodes(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    script, runners = bench
    tiny = {**script.SMOLLM2_135M, "num_hidden_layers": 2, "hidden_size": 72, "intermediate_size": 96}
    source = script.random_model(tmp_path, tiny)
    assert source.config.num_layers == 2 and source.load_tokenizer().decode([5, 6]) == "w5 w6"
    runner = runners.MohawkRunner(EngineSettings(device="cpu", weights="bf16", num_kv_blocks=64), source)
    first_token_s, tokens_per_s = runner.batch1(script.PROMPT, 8)
    assert first_token_s > 0 and tokens_per_s > 0


def test_without_a_gpu_it_says_so_and_exits_cleanly(
    bench: tuple[ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    script, _ = bench
    if script.torch.cuda.is_available():
        pytest.skip("a GPU is here: the bench would run")
    assert script.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_the_streams_are_distinct_prompts_and_run_concurrently(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    script, runners = bench
    prompts = script.stream_prompts(32)
    assert len({tuple(p) for p in prompts}) == 32 and {len(p) for p in prompts} == set(range(9, 17))
    tiny = {**script.SMOLLM2_135M, "num_hidden_layers": 2, "hidden_size": 72, "intermediate_size": 96}
    runner = runners.MohawkRunner(
        EngineSettings(device="cpu", weights="bf16", num_kv_blocks=64), script.random_model(tmp_path, tiny)
    )
    assert runner.concurrent(prompts[:4], 4) > 0
