"""bench/architectures.py's comparison in seconds: one tiny Mixtral GGUF (a `llama` file: permuted q/k
rows, 3-D experts; no vocabulary, which llama.cpp accepts as `none`), written F16 and made Q4_K_M by
llama.cpp's own quantizer, its logits at every position of one sequence through llama-cpp-python
and Mohawk. Skips where llama-cpp-python is not installed (CI; `make bench` installs it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFValueType

from mohawk_common.model_store import open_model
from tests.bench import ROOT
from tests.common.model_store.gguf_export import export_gguf
from tests.shard.engine.conftest import full_logits
from tests.shard.engine.test_gguf_architectures import FLOAT_FILE, build_reference

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python not installed (the bench extra, which `make bench` installs)",
)
SEQUENCE = [int(t) for t in np.random.default_rng(0).integers(3, 256, 72)]
NO_VOCAB = (("tokenizer.ggml.model", "none", (GGUFValueType.STRING,)),)


def argmax_agreement(ours: torch.Tensor, theirs: np.ndarray) -> float:
    return float((ours.numpy().argmax(-1) == theirs.argmax(-1)).mean())


def test_greedy_tokens_agree_with_llama_cpp(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from architectures import quantize_q4_k_m
    from llama_cpp_batch import LlamaCppBatch

    f16, q4 = tmp_path / "mixtral-f16.gguf", tmp_path / "mixtral-q4_k_m.gguf"
    export_gguf(f16, build_reference("mixtral"), "llama", FLOAT_FILE | {"attn_k": "F16"}, fields=NO_VOCAB)
    quantize_q4_k_m(f16, q4, num_threads=2)
    figures = {}
    for path, weights in ((f16, "fp32"), (q4, "fp32"), (q4, "native")):
        llama = LlamaCppBatch(path, num_threads=2, num_seqs=1, n_ctx=256)
        theirs = llama.all_logits(SEQUENCE)
        llama.close()
        ours = full_logits(open_model(path), SEQUENCE, weights=weights)
        figures[f"{path.stem} {weights}"] = argmax_agreement(ours, theirs)
    print(figures)
    # the same float weights on both sides: only the model code differs, so the argmax must agree
    assert figures["mixtral-f16 fp32"] >= 0.95, figures
    # Q4_K_M: llama.cpp rounds activations to 8 bits before each quantized matmul, so near-ties of
    # this random model flip (bench/architectures.py reports the gaps); a wrong decoding would not
    # stay this close
    assert min(figures["mixtral-q4_k_m fp32"], figures["mixtral-q4_k_m native"]) >= 0.8, figures
