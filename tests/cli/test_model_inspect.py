"""`mohawk model inspect`: a tiny random-weight GGUF written here, read back as the loader and the
planner would hold it; bad files end as one line naming the file and the tensor."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from mohawk_cli.model_report import inspect_model, layer_weight_bytes
from mohawk_common.model_store import open_model
from mohawk_common.model_store.gguf_source import gguf_tensor_name
from mohawk_shard.backends import make_backend
from mohawk_shard.node.capacity import measure_capacity
from tests.cli.helpers import mohawk_in_process
from tests.common.model_store.test_store_bad_gguf import Q_PROJ, set_tensor_type
from tests.common.model_store.test_store_gguf_tiny import NUM_LAYERS, random_llama_state, write_llama_gguf

HAS_MLX = importlib.util.find_spec("mlx_lm") is not None  # the mlx extra


@pytest.fixture(scope="module")
def q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("q4_1") / "tiny.gguf"
    write_llama_gguf(path, random_llama_state(untied=True), GGMLQuantizationType.Q4_1)
    return path


def test_text_report_of_a_q4_1_file(capsys: pytest.CaptureFixture[str], q4_1: Path) -> None:
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(q4_1))
    assert code == 0, err
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert lines[0].startswith(f"{q4_1}: GGUF, ")
    assert "model tiny-llama (llama): 2 layers, hidden 64, 4 heads (2 KV) of 16, MLP 96, vocab 128" in lines
    assert any(line.startswith("stored Q4_1 16 tensors") for line in lines)
    assert "torch cpu (float32)" in lines and "torch cuda (bfloat16)" in lines and "mlx (float32)" in lines
    assert lines.count("layer matmuls 8 int4 from Q4_1") == 2  # torch cpu and cuda
    if HAS_MLX:
        assert "layer matmul weights 14 4-bit from Q4_1" in lines  # q, k, v, o, gate, up, down
    assert lines.count("lm head 1 int4 from Q4_1") == 2
    assert "dequantized: nothing" in lines
    assert "weight memory of a stage of 2 layers (what a node reports to the planner):" in lines


def test_layer_bytes_are_what_the_node_measures(q4_1: Path) -> None:
    """The bytes inspect reports are those of the stage the loader builds, and the heartbeat's."""
    source = open_model(q4_1)
    report = inspect_model(source, stage_layers=NUM_LAYERS)
    cpu = next(m for m in report.memory if m.backend == "torch cpu")
    stage = make_backend("torch", source, 0, NUM_LAYERS, device="cpu", dtype="auto", weights="native")
    assert cpu.stages[0].total == stage.weight_bytes
    capacity = measure_capacity(
        source, device="cpu", dtype="auto", block_size=16, memory_limit_mb=None, kv_cache_memory_mb=None
    )
    assert layer_weight_bytes(source, 0, "native", "float32") == capacity.layer_weight_bytes


def test_stages_of_fewer_layers(capsys: pytest.CaptureFixture[str], q4_1: Path) -> None:
    code, out, _ = mohawk_in_process(capsys, "model", "inspect", str(q4_1), "--layers", "1", "--json")
    assert code == 0
    report = json.loads(out)
    stages = report["memory"][0]["stages"]
    assert [(s["start"], s["end"]) for s in stages] == [(0, 1), (1, 2)]
    assert stages[0]["layers"] == stages[1]["layers"] > 0
    assert all(s["total"] == s["layers"] + s["ends"] for s in stages)
    assert report["stage_layers"] == 1 and report["weights"] == "native"
    assert {"format": "Q4_1", "num_tensors": 16, "num_bytes": report["stored"][0]["num_bytes"]} in report[
        "stored"
    ]


def write_raw_layers(path: Path, kind: GGMLQuantizationType = GGMLQuantizationType.IQ4_NL) -> None:
    """Layer matmuls stored as `kind` (random bytes: inspect reads none), a Q8_0 tied token table."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in TINY_METADATA.items():
        getattr(writer, f"add_{key}")(value)
    rng = np.random.default_rng(0)
    block, size = GGML_QUANT_SIZES[kind]
    for name, array in random_llama_state(untied=False).items():
        if name == "embed_tokens.weight":
            writer.add_tensor(
                gguf_tensor_name(name),
                quantize(array, GGMLQuantizationType.Q8_0),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )
        elif array.ndim == 2:
            blocks = rng.integers(0, 255, (array.shape[0], array.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(gguf_tensor_name(name), blocks, raw_dtype=kind)
        else:
            writer.add_tensor(gguf_tensor_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


TINY_METADATA = {
    "block_count": NUM_LAYERS,
    "context_length": 256,
    "embedding_length": 64,
    "feed_forward_length": 96,
    "head_count": 4,
    "head_count_kv": 2,
    "layer_norm_rms_eps": 1e-5,
    "vocab_size": 128,
    "rope_dimension_count": 16,
}


def test_what_has_no_kernel_is_dequantized_and_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "iq4_nl.gguf"
    write_raw_layers(path)
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(path), "--json")
    assert code == 0, err
    backends = {b["backend"]: b for b in json.loads(out)["backends"]}
    matmuls = [g for g in backends["torch cpu"]["groups"] if g["part"] == "layer matmuls"]
    assert {(g["held"], g["num"]) for g in matmuls} == {("float32", NUM_LAYERS)}
    assert sorted(g["dequantized"] for g in matmuls) == [
        "mlp.down_proj.weight stored as IQ4_NL",
        "mlp.gate_proj.weight, mlp.up_proj.weight stored as IQ4_NL/IQ4_NL",
        "self_attn.o_proj.weight stored as IQ4_NL",
        "self_attn.q_proj.weight, self_attn.k_proj.weight, self_attn.v_proj.weight "
        "stored as IQ4_NL/IQ4_NL/IQ4_NL",
    ]
    cpu = {g["part"]: g for g in backends["torch cpu"]["groups"]}
    assert cpu["embedding"]["held"] == "8-bit groupwise, the file's Q8_0 codes"
    assert cpu["lm head (tied)"]["held"].startswith("int4 regrouped from Q8_0 + exact Q8_0 rows")
    if HAS_MLX:
        mlx = {g["part"]: g for g in backends["mlx"]["groups"]}
        assert mlx["layer matmul weights"]["held"] == "float32"
        assert mlx["layer matmul weights"]["dequantized"] == "no MLX kernel for IQ4_NL"
        assert mlx["embedding + lm head (tied)"]["held"] == "8-bit from Q8_0"
    code, out, _ = mohawk_in_process(capsys, "model", "inspect", str(path), "--weights", "bf16")
    assert code == 0
    assert "[dequantized: --weights bf16 holds every matmul dense]" in out


def write_broken(tmp_path: Path, how: str) -> tuple[Path, str]:
    """A tiny Q4_1 GGUF broken one way, and what the one-line error must say."""
    state = random_llama_state(untied=False)
    if how == "missing-tensor":
        del state["layers.1.mlp.up_proj.weight"]
    if how == "misshapen-tensor":
        state[Q_PROJ] = state[Q_PROJ][:, :32].copy()
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, state, GGMLQuantizationType.Q4_1)
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    if how == "unknown-quant-type":
        set_tensor_type(path, "blk.0.attn_q.weight", 250)
    if how == "not-gguf":
        path.write_bytes(b"<html>404 Not Found</html>")
    return path, {
        "missing-tensor": "has no tensor blk.1.ffn_up.weight (for layers.1.mlp.up_proj.weight)",
        "misshapen-tensor": f"tensor {Q_PROJ} of {path} has shape [64, 32], the config implies [64, 64]",
        "truncated": "the file is truncated: tensor blk.1.ffn_down.weight (Q4_1 [64, 96]) needs bytes",
        "unknown-quant-type": "tensor blk.0.attn_q.weight has unknown quantization type 250",
        "not-gguf": "not a GGUF file: it starts with b'<htm', a GGUF file with b'GGUF'",
    }[how]


BROKEN = ["missing-tensor", "misshapen-tensor", "truncated", "unknown-quant-type", "not-gguf"]


@pytest.mark.parametrize("how", BROKEN)
def test_bad_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, how: str) -> None:
    path, needle = write_broken(tmp_path, how)
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(path))
    assert code == 2 and not out
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("mohawk model inspect: error: ") and str(path) in err and needle in err, err


@pytest.mark.parametrize("how", BROKEN)
def test_generate_on_a_bad_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, how: str
) -> None:
    path, needle = write_broken(tmp_path, how)
    code, out, err = mohawk_in_process(capsys, "generate", "--prompt", "hi", "--model", str(path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and not out and len(lines) == 1, err
    assert str(path) in lines[0] and needle in lines[0], err


def test_unknown_architecture_and_bad_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv7")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, _, err = mohawk_in_process(capsys, "model", "inspect", str(path))
    assert code == 2 and f"{path}: unsupported architecture 'rwkv7' (supported: llama" in err
    code, _, err = mohawk_in_process(capsys, "model", "inspect", str(tmp_path / "nope.gguf"))
    assert code == 2 and "does not exist" in err


def test_bad_layers_and_weights(capsys: pytest.CaptureFixture[str], q4_1: Path) -> None:
    code, _, err = mohawk_in_process(capsys, "model", "inspect", str(q4_1), "--layers", "3")
    assert code == 2 and "--layers 3: tiny-llama has 1 to 2 layers" in err
    code, _, err = mohawk_in_process(capsys, "model", "inspect", str(q4_1), "--weights", "int3")
    assert code == 2 and "weights 'int3' is not one of" in err


def test_int4_regroups_float_layers(tmp_path: Path) -> None:
    path = tmp_path / "f32.gguf"
    write_llama_gguf(path, random_llama_state(untied=False))
    source = open_model(path)
    native, int4 = (inspect_model(source, weights=w) for w in ("native", "int4"))
    cpu = {g.part: g for g in native.backends[0].groups}
    assert cpu["layer matmuls"].held == "float32" and cpu["layer matmuls"].dequantized is None
    cpu = {g.part: g for g in int4.backends[0].groups}
    assert cpu["layer matmuls"].held == "int4 regrouped from F32"
    assert cpu["embedding"].held == "8-bit groupwise with minimums, re-grouped from F32 at load"
    assert int4.memory[0].stages[0].total < native.memory[0].stages[0].total
    assert np.isclose(
        native.memory[0].stages[0].layers, NUM_LAYERS * layer_weight_bytes(source, 0, "native", "float32")
    )


@pytest.mark.slow
def test_bundled_smollm2(capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2-135M Q4_1: its layers run 4-bit from the file's codes; its Q8_0 table stays 8-bit
    groupwise, and the tied head ranks 4-bit and rescores from the Q8_0 rows."""
    from mohawk_common.model_store import bundled_model_path

    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(bundled_model_path()), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["architecture"], report["num_layers"], report["tie_word_embeddings"]) == (
        "llama",
        30,
        True,
    )
    stored = {s["format"]: s["num_tensors"] for s in report["stored"]}
    assert stored == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    backends = {b["backend"]: {g["part"]: g for g in b["groups"]} for b in report["backends"]}
    for torch_backend in ("torch cpu", "torch cuda"):
        groups = backends[torch_backend]
        assert (groups["layer matmuls"]["held"], groups["layer matmuls"]["num"]) == ("int4 from Q4_1", 120)
        assert groups["embedding"]["held"] == "8-bit groupwise, the file's Q8_0 codes"
        assert all(g["dequantized"] is None for g in groups.values())
    assert "(SplitQ8Head)" in backends["torch cpu"]["lm head (tied)"]["held"]
    assert "(RescoredHead)" in backends["torch cuda"]["lm head (tied)"]["held"]
    if HAS_MLX:
        assert backends["mlx"]["layer matmul weights"]["held"] == "4-bit from Q4_1"
        assert backends["mlx"]["embedding + lm head (tied)"]["held"] == "8-bit from Q8_0"


def test_safetensors_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A bf16 Qwen2 directory (q/k/v biases): dense everywhere under native, its bytes those of the
    stage the loader builds; a misshapen tensor in its header is one line."""
    import torch

    from tests.common.model_store.test_store_safetensors import save_tiny_model

    save_tiny_model(tmp_path, "qwen2", num_kv_heads=2, tied=False, dtype=torch.bfloat16)
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(tmp_path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["file_format"], report["architecture"], report["num_layers"]) == (
        "safetensors",
        "qwen2",
        4,
    )
    assert [(s["format"], s["num_tensors"]) for s in report["stored"]] == [("BF16", 4 * 12 + 3)]
    cpu = {g["part"]: g for g in report["backends"][0]["groups"]}
    assert (cpu["layer matmuls"]["held"], cpu["layer matmuls"]["num"]) == ("float32", 16)
    assert cpu["norms and biases"]["num"] == 4 * 5 + 1
    stage = make_backend("torch", open_model(tmp_path), 0, 4, device="cpu", dtype="auto", weights="native")
    assert report["memory"][0]["stages"][0]["total"] == stage.weight_bytes
    int4 = inspect_model(open_model(tmp_path), weights="int4", stage_layers=2)
    assert [(s.start, s.end) for s in int4.memory[0].stages] == [(0, 2), (2, 4)]
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.2.mlp.down_proj.weight"] = tensors["model.layers.2.mlp.down_proj.weight"][
        :, :64
    ].contiguous()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    code, _, err = mohawk_in_process(capsys, "model", "inspect", str(tmp_path))
    assert code == 2 and err.count("\n") == 1
    assert (
        f"tensor layers.2.mlp.down_proj.weight of {tmp_path} has shape [64, 64], the config implies [64, 96]"
        in err
    )


def test_q4_k_m_style_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Q4_K layers with wider Q6_K/Q5_0 parts (as Q4_K_M files): each part in its own format, and
    the bytes those of the stage the loader builds."""
    from tests.shard.model.test_kquant_native import NUM_LAYERS as KQUANT_LAYERS
    from tests.shard.model.test_kquant_native import write_kquant_gguf

    path = tmp_path / "tiny-q4_k_m.gguf"
    write_kquant_gguf(path)
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(path), "--json")
    assert code == 0, err
    report = json.loads(out)
    cpu = report["backends"][0]["groups"]
    held = {g["held"] for g in cpu if g["part"] == "layer matmuls"}
    assert "int4 from Q4_K + int8 groupwise from Q6_K" in held and "int4 from Q4_K" in held
    assert all(g["dequantized"] is None for g in cpu)
    stage = make_backend("torch", open_model(path), 0, KQUANT_LAYERS, device="cpu", dtype="auto")
    assert report["memory"][0]["stages"][0]["total"] == stage.weight_bytes


def test_a_type_nothing_decodes_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "q8_1.gguf"
    write_raw_layers(path, GGMLQuantizationType.Q8_1)
    code, out, err = mohawk_in_process(capsys, "model", "inspect", str(path))
    assert code == 2 and not out and err.count("\n") == 1
    assert (
        f"{path}: tensor blk." in err
        and "is stored as Q8_1, which neither Mohawk nor the gguf package can decode" in err
    )
    code, out, err = mohawk_in_process(capsys, "generate", "--prompt", "hi", "--model", str(path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert f"of {path}: Dequantization for Q8_1 is not yet implemented" in lines[0]


def test_without_mlx_it_says_so(monkeypatch: pytest.MonkeyPatch, q4_1: Path) -> None:
    from mohawk_cli import model_report

    monkeypatch.setattr(model_report, "_mlx_quant", lambda: None)
    mlx = inspect_model(open_model(q4_1)).backends[-1]
    assert (mlx.backend, mlx.groups, mlx.note) == (
        "mlx",
        [],
        "MLX is not installed here, so its choices are not shown",
    )
