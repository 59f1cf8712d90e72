"""Write a transformers model to GGUF as llama.cpp's converter does, in chosen tensor types.

For tests of GGUF architectures without a download: tensor names from gguf's own `TensorNameMap`,
Gemma's norms stored as 1 + w, q/k rows of `llama` files permuted, experts stacked into 3-D
`ffn_*_exps` tensors, the metadata keys llama.cpp writes for each architecture. A tensor given a
quantized type is written as random valid blocks of it (K-quants have no quantizer in gguf-py),
and the model's own parameter is set to what those blocks decode to, so the model stays the
reference for exactly the file's weights. F16 tensors round the model's parameter the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from mohawk_common.model_store.gguf_source import permute_rotary_rows, unpermute_rotary_rows
from tests.common.model_store.test_kquant_blocks import random_blocks

_EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_GEMMA = ("gemma2", "gemma3")
_RANDOM_BLOCKS = frozenset({"Q4_K", "Q5_K", "Q6_K", "Q2_K"})  # no quantizer in gguf-py


def export_gguf(
    path: Path,
    model: Any,
    arch: str,
    formats: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    fields: Sequence[tuple[str, Any, Sequence[Any]]] = (),
    split_experts: bool = False,
) -> dict[str, str]:
    """Write `model` (fp32) to `path` as a GGUF of `arch`; `formats` maps a GGUF tensor kind
    (`attn_q`, `ffn_down_exps`, `token_embd`, ...) to a type name (default F32). `metadata`:
    extra `add_*` calls of `GGUFWriter` (`{"rope_freq_base_swa": 10000.0}`); `fields`: keys copied
    from another file, `(key, contents, value types)` as `GGUFReader` reads them; `split_experts`:
    each expert's matrices as 2-D `blk.N.ffn_gate.E.weight` tensors, the layout before the 3-D
    `ffn_*_exps`. Returns each tensor's written type by GGUF name."""
    import gguf

    formats = dict(formats or {})
    config = model.config
    tensors = _gguf_tensors(model, arch)
    writer = gguf.GGUFWriter(str(path), arch)
    _write_metadata(writer, config, arch, named=any(key == "general.name" for key, _, _ in fields))
    for key, value in (metadata or {}).items():
        getattr(writer, f"add_{key}")(value)
    for key, contents, types in fields:
        writer.add_key_value(key, contents, types[0], types[1] if len(types) > 1 else None)
    written = {}
    for seed, (name, (array, set_back)) in enumerate(tensors.items()):
        kind = name.split(".")[-2]
        type_name = formats.get(kind, "F32") if array.ndim > 1 else "F32"
        if split_experts and kind in _EXPERT_PARTS:
            # llama.cpp before April 2024 (TheBloke's Mixtral files): one 2-D tensor per expert
            layer, base = name.split(".")[1], kind.removesuffix("_exps")
            decoded = [
                _write_tensor(writer, f"blk.{layer}.{base}.{e}.weight", array[e], type_name, seed * 1000 + e)
                for e in range(array.shape[0])
            ]
            set_back(np.stack(decoded))
        else:
            set_back(_write_tensor(writer, name, array, type_name, seed))
        written[name] = type_name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def _write_tensor(writer: Any, name: str, array: np.ndarray, type_name: str, seed: int) -> np.ndarray:
    """Write `array` as `name` in `type_name`; returns what the written bytes decode to."""
    import gguf

    if type_name == "F32":
        writer.add_tensor(name, array)
        return array
    if type_name == "F16":
        half = array.astype(np.float16)
        writer.add_tensor(name, half)
        return half.astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    raw = _blocks(array, type_name, seed)
    writer.add_tensor(name, raw, raw_dtype=qtype)
    return np.asarray(gguf.quants.dequantize(raw, qtype)).reshape(array.shape)


def _blocks(array: np.ndarray, type_name: str, seed: int) -> np.ndarray:
    """The array quantized by gguf-py where it has a quantizer, else random valid blocks."""
    import gguf

    if type_name not in _RANDOM_BLOCKS:
        return gguf.quants.quantize(array, GGMLQuantizationType[type_name])
    rows = int(np.prod(array.shape[:-1]))
    raw = random_blocks(type_name, rows, array.shape[-1], seed=seed, exponents=(-13, -11))
    return raw.reshape(*array.shape[:-1], -1)


def _write_metadata(writer: Any, config: Any, arch: str, named: bool) -> None:
    import gguf

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not named:
        writer.add_name(f"tiny-{arch}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    rope = config.rope_parameters
    writer.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    if getattr(config, "num_local_experts", None):
        writer.add_expert_count(config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if arch in _GEMMA:
        writer.add_sliding_window(config.sliding_window)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    full = rope.get("full_attention", rope)
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(full["factor"]))


def _gguf_tensors(model: Any, arch: str) -> dict[str, tuple[np.ndarray, Any]]:
    """GGUF name -> (array as the file stores it, a function setting the model's parameter from
    the array the file's bytes decode to)."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    tensors: dict[str, tuple[np.ndarray, Any]] = {}
    for hf_name, param in model.state_dict(keep_vars=True).items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if hf_name.endswith(".mlp.experts.gate_up_proj") or hf_name.endswith(".mlp.experts.down_proj"):
            tensors.update(_expert_tensors(hf_name, param))
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name}")
        heads = _permuted_heads(arch, name, config)
        shift = 1.0 if arch in _GEMMA and hf_name.endswith("norm.weight") else 0.0
        array = param.detach().numpy().astype(np.float32) + shift
        if heads is not None:
            array = permute_rotary_rows(array, heads)
        tensors[name] = (array, _setter(param, heads, shift))
    return tensors


def _expert_tensors(hf_name: str, param: torch.Tensor) -> dict[str, tuple[np.ndarray, Any]]:
    """transformers 5's fused [experts, 2 * inter, hidden] gate_up and [experts, hidden, inter] down."""
    layer = hf_name.split(".")[2]
    stacked = param.detach().numpy()
    if hf_name.endswith("down_proj"):
        return {f"blk.{layer}.ffn_down_exps.weight": (stacked.copy(), _setter(param, None, 0.0))}
    inter = stacked.shape[1] // 2
    out = {}
    for half, kind in enumerate(("ffn_gate_exps", "ffn_up_exps")):
        rows = slice(half * inter, (half + 1) * inter)

        def set_half(array: np.ndarray, rows: slice = rows) -> None:
            with torch.no_grad():
                param[:, rows].copy_(torch.from_numpy(np.ascontiguousarray(array)))

        out[f"blk.{layer}.{kind}.weight"] = (np.ascontiguousarray(stacked[:, rows]), set_half)
    return out


def _setter(param: torch.Tensor, heads: int | None, shift: float) -> Any:
    def set_back(array: np.ndarray) -> None:
        if heads is not None:
            array = unpermute_rotary_rows(array, heads)
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(array - shift)))

    return set_back


def _permuted_heads(arch: str, name: str, config: Any) -> int | None:
    if arch != "llama":
        return None
    if ".attn_q." in name:
        return int(config.num_attention_heads)
    if ".attn_k." in name:
        return int(config.num_key_value_heads)
    return None
