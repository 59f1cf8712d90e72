"""Gemma 2, Gemma 3 text and Mixtral GGUF files, written here as llama.cpp's converter writes them
(Gemma's norms as 1 + w, Mixtral as a `llama` file with 3-D expert tensors and permuted q/k rows),
against transformers running the weights the file decodes to: fp32 logits whole and split over
two stages, and the file's own quantized codes (Q4_K, Q6_K, Q5_0, Q8_0) held natively."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource, open_model
from mohawk_common.model_store.gguf_file import GGUFFile
from tests.common.model_store.gguf_export import export_gguf

from .conftest import full_logits, reference_logits

HIDDEN, INTERMEDIATE, VOCAB = 256, 512, 256  # K-quant rows are whole super-blocks of 256
PROMPT = [5, 200, 17, 40, 33, 2, 77, 123, 8, 9, 10, 11, 250, 3]  # longer than the windows


@dataclass(frozen=True)
class Variant:
    model_type: str
    arch: str  # the GGUF architecture llama.cpp writes
    options: dict[str, Any]
    native: dict[str, str] = field(default_factory=dict)  # GGUF tensor kind -> type of the native file


VARIANTS = {
    "gemma2": Variant(
        "gemma2",
        "gemma2",
        {
            "num_hidden_layers": 2,  # llama.cpp's period 2: layer 0 slides, layer 1 attends to all
            "head_dim": 64,
            "query_pre_attn_scalar": 64,  # llama.cpp's head_dim (the file has no key for it)
            "sliding_window": 4,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
        {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K"}
        | {"ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"},
    ),
    "gemma3": Variant(
        "gemma3_text",
        "gemma3",
        {
            "num_hidden_layers": 6,  # llama.cpp's period 6: layer 5 attends to all
            "head_dim": 64,
            "query_pre_attn_scalar": 64,
            "sliding_window": 4,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            },
        },
        {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q5_0", "attn_output": "Q8_0", "ffn_gate": "Q4_K"}
        | {"ffn_up": "Q4_K", "ffn_down": "Q8_0", "token_embd": "Q4_K"},
    ),
    "mixtral": Variant(
        "mixtral",
        "llama",
        {"num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
        {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate_exps": "Q4_K"}
        | {"ffn_up_exps": "Q8_0", "ffn_down_exps": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"},
    ),
}
FLOAT_FILE = {
    "attn_q": "F16",
    "attn_v": "F16",
    "ffn_down": "F16",
    "ffn_down_exps": "F16",
    "token_embd": "F16",
}


def build_reference(kind: str) -> Any:
    """A random-weight transformers model of `kind`, its weights widened so outputs depend on them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    variant = VARIANTS[kind]
    config = AutoConfig.for_model(
        variant.model_type,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        **variant.options,
    )
    torch.manual_seed(sum(map(ord, kind)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(4.0) if param.dim() > 1 else param.add_(torch.randn_like(param) * 0.1)
    return model


def write_tiny_gguf(kind: str, directory: Path, *, native: bool) -> tuple[ModelSource, Any]:
    """The variant's GGUF (its quantized types when `native`, else F16/F32) and the transformers
    model holding exactly the weights the file decodes to."""
    model = build_reference(kind)
    path = directory / f"tiny-{kind}-{'native' if native else 'float'}.gguf"
    export_gguf(path, model, VARIANTS[kind].arch, VARIANTS[kind].native if native else FLOAT_FILE)
    return open_model(path), model


@pytest.fixture(scope="module", params=list(VARIANTS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float) -> float:
    diff = (ours - theirs).abs().max().item()
    assert diff < tolerance * max(1.0, theirs.abs().max().item()), diff
    return diff


def test_config_from_the_file(kind: str, tmp_path: Path) -> None:
    source, model = write_tiny_gguf(kind, tmp_path, native=False)
    config, hf = source.config, model.config
    assert config.architecture == VARIANTS[kind].model_type
    assert config.num_layers == hf.num_hidden_layers and config.head_dim == 64
    if kind == "mixtral":
        assert (config.num_experts, config.num_experts_per_tok) == (4, 2)
        assert config.moe_intermediate_size == INTERMEDIATE
        return
    windowed = [i for i, t in enumerate(hf.layer_types) if t == "sliding_attention"]
    assert config.sliding_window == 4 and list(config.sliding_layers or ()) == windowed
    assert config.query_pre_attn_scalar == 64
    assert config.attn_logit_softcapping == hf.attn_logit_softcapping
    assert config.final_logit_softcapping == hf.final_logit_softcapping
    if kind == "gemma3":
        assert config.rope_local_theta == 10000.0 and config.rope_theta == 1e6
        assert config.rope_scaling is not None and config.rope_scaling["factor"] == 4.0
    norm = source.read_tensor("layers.1.post_feedforward_layernorm.weight")  # stored as 1 + w
    expected = model.model.layers[1].post_feedforward_layernorm.weight.detach()
    assert (torch.from_numpy(norm) - expected).abs().max().item() < 1e-6


@pytest.mark.parametrize("native", [False, True], ids=["float-file", "quantized-file"])
def test_fp32_logits_whole_and_split(kind: str, native: bool, tmp_path: Path) -> None:
    """fp32 mode runs the dequantized weights, as transformers does: within 1e-4."""
    source, model = write_tiny_gguf(kind, tmp_path, native=native)
    theirs = reference_logits(model, PROMPT)
    for split in [(), (1,)]:
        _assert_close(full_logits(source, PROMPT, split, block_size=4), theirs, 1e-4)


def test_native_logits(kind: str, tmp_path: Path) -> None:
    """The file's own codes: 4-bit ones through the row kernel (int8 activations a group of 32, as
    llama.cpp's), 5-, 6- and 8-bit ones exact in fp32. Against transformers' fp32 logits, measured:
    typical differences (the median) 0.010 of 30.0 Gemma 2, 0.004 of 28.4 Gemma 3 and 0.012 of 23.9
    Mixtral; the largest 0.57, 0.034 and 1.00 (Mixtral's at the one position where a near tie
    between experts routed differently). The same greedy token at every position."""
    source, model = write_tiny_gguf(kind, tmp_path, native=True)
    theirs = reference_logits(model, PROMPT)
    ours = full_logits(source, PROMPT, (1,), block_size=4, weights="native")
    scale = theirs.abs().max().item()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().median().item() < 2e-3 * scale
    diff = _assert_close(ours, theirs, 0.08)
    print(f"{kind}: max |native - transformers| {diff:.4f} of {scale:.2f}")


def test_a_mixtral_file_with_a_tensor_per_expert(tmp_path: Path) -> None:
    """Mixtral GGUFs written before llama.cpp stacked experts (April 2024; TheBloke's files) hold
    each expert's matrices as 2-D `blk.N.ffn_gate.E.weight` tensors: read as the 3-D layout is,
    natively, and a missing expert is named."""
    model = build_reference("mixtral")
    path = tmp_path / "tiny-mixtral-per-expert.gguf"
    export_gguf(path, model, "llama", VARIANTS["mixtral"].native, split_experts=True)
    tensors = GGUFFile(path).tensors
    assert "blk.1.ffn_down.3.weight" in tensors and "blk.1.ffn_down_exps.weight" not in tensors
    source = open_model(path)
    source.check_tensors()
    assert source.stored_format("layers.1.mlp.experts.3.down_proj.weight") == "Q6_K"
    theirs = reference_logits(model, PROMPT)
    _assert_close(full_logits(source, PROMPT, (1,), block_size=4), theirs, 1e-4)
    _assert_close(full_logits(source, PROMPT, (1,), block_size=4, weights="native"), theirs, 0.08)

    broken = tmp_path / "tiny-mixtral-missing-expert.gguf"
    content = path.read_bytes()
    broken.write_bytes(content.replace(b"blk.1.ffn_up.2.weight", b"blk.1.ffn_up.9.weight"))
    with pytest.raises(
        ModelLoadError, match=r"no tensor blk\.1\.ffn_up_exps\.weight or blk\.1\.ffn_up\.2\.weight"
    ):
        open_model(broken).check_tensors()
