"""A model in one GGUF file (llama.cpp's format), dequantized one tensor at a time."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import check_architecture, config_from_hf
from mohawk_common.model_store.gguf_blocks import decode_gguf_blocks
from mohawk_common.model_store.gguf_cache import (
    cached_config,
    cached_model_config,
    cached_tokenizer,
    entry_dir,
    keep_model_config,
)
from mohawk_common.model_store.gguf_config import GEMMA_ARCHITECTURES, complete_config
from mohawk_common.model_store.quantized import DECODABLE_FORMATS, GroupQuantized, StoredBlocks
from mohawk_common.model_store.source import ModelSource, expected_shape, one_line
from mohawk_common.model_store.token_decoder import LazyTokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from mohawk_common.model_store.gguf_file import GGUFFile, GGUFTensorInfo

# Canonical name pieces -> GGUF (llama.cpp) tensor name pieces.
_TOP_LEVEL = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",  # a MoE layer's router
    # fused in Phi-3 files (`source.fused_part` reads q/k/v and gate/up out of them)
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
}
# a MoE layer's experts: one 3-D tensor [experts, rows, columns] a matrix kind (files written before
# April 2024, Mixtral's above all, hold one 2-D `blk.N.ffn_gate.E.weight` per expert instead)
_EXPERT_PARTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
_EXPERT_NAME = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
# Gemma's layer norms: after attention, before and after the MLP (`ffn_norm` is Llama's second)
_GEMMA_LAYER_PARTS = _LAYER_PARTS | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# GGUF architecture names that differ from the transformers model_type
_GGUF_ARCHITECTURES = {"qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")
# GGUF architectures whose attn_q/attn_k rows llama.cpp's converter permutes (Mistral is "llama").
_PERMUTED_ARCHITECTURES = frozenset({"llama"})


class GGUFSource(ModelSource):
    """A `.gguf` file: config and tokenizer through transformers, weights through `gguf`."""

    @classmethod
    def open(cls, path: Path) -> GGUFSource:
        """Read the config of a GGUF file; its tensors are only mapped when weights are loaded.
        A file opened before gives its config from the cache, without transformers."""
        from mohawk_common.model_store.gguf_file import GGUFFile

        # our own index first: its errors name the file and tensor where transformers' do not
        index = GGUFFile(path)
        arch = str(index.metadata.get("general.architecture"))
        check_architecture(_GGUF_ARCHITECTURES.get(arch, arch), path)
        config = cached_model_config(path)
        hf_config = None
        if config is None:
            hf_config, model_id = _read_hf_config(path, index)
            config = config_from_hf(hf_config, model_id)
            keep_model_config(path, config)
        source = cls(path, config, hf_config)
        source.__dict__["_file"] = index  # the index just read (`_file` is a cached property)
        source.check_variant()
        return source

    def load_decoder(self) -> Any:
        folder = _kept_tokenizer_folder(self.path)
        if folder is None:  # nothing kept yet: transformers reads the file, and keeps it for next time
            return self.load_tokenizer()
        return LazyTokenizer(folder, self.load_tokenizer)

    def _load_hf_config(self) -> PretrainedConfig:
        return _read_hf_config(self.path, self._file)[0]

    def check_variant(self) -> None:
        """Refuse a file whose settings the config cannot carry (Phi-3's LongRoPE factor tensors
        and partial rotary), which would otherwise run wrong."""
        arch = self._arch
        if arch != "phi3":
            return
        if (
            "rope_factors_long.weight" in self._file.tensors
            or "rope_factors_short.weight" in self._file.tensors
        ):
            raise ModelLoadError(f"{self.path}: Phi-3 GGUF with LongRoPE factors is not supported")
        rotary = self._file.metadata.get("phi3.rope.dimension_count")
        if rotary is not None and int(str(rotary)) != self.config.rotary_dim:
            raise ModelLoadError(
                f"{self.path}: Phi-3 GGUF with partial rotary ({rotary} dims) is not supported"
            )

    @cached_property
    def _arch(self) -> str:
        return str(self._file.metadata.get("general.architecture"))

    @cached_property
    def _file(self) -> GGUFFile:
        from mohawk_common.model_store.gguf_file import GGUFFile

        return GGUFFile(self.path)

    def _info(self, name: str) -> GGUFTensorInfo:
        canonical = self.file_tensor(name)[0]
        gguf_name = gguf_tensor_name(canonical, self._arch)
        info = self._file.tensors.get(gguf_name)
        if info is None:
            expert = _EXPERT_NAME.fullmatch(canonical)
            if expert is not None:  # llama.cpp before April 2024: a 2-D tensor per expert
                layer, index, kind = expert.groups()
                base = _EXPERT_PARTS[kind].removesuffix("_exps")
                info = self._file.tensors.get(f"blk.{layer}.{base}.{index}.weight")
                gguf_name += f" or blk.{layer}.{base}.{index}.weight"
        if info is None:
            raise ModelLoadError(f"GGUF file {self.path} has no tensor {gguf_name} (for {name})")
        return info

    def stored_format(self, name: str) -> str:
        return self._info(self.stored_name(name)).tensor_type.name

    def stored_shape(self, name: str) -> tuple[int, ...]:
        shape = self._info(self.stored_name(name)).shape
        return shape[1:] if _EXPERT_NAME.fullmatch(name) and len(shape) == 3 else shape

    def read_quantized(self, name: str) -> GroupQuantized | None:
        blocks = self.read_blocks(name)
        if blocks is None:
            return None
        file_shape = (blocks.raw.shape[0], blocks.shape[1])  # every row the file holds
        tensor = decode_gguf_blocks(blocks.raw, blocks.type_name, file_shape)
        return tensor if blocks.rows is None else tensor.take_rows(blocks.rows)

    def read_blocks(self, name: str) -> StoredBlocks | None:
        name = self.stored_name(name)
        info = self._info(name)
        raw, shape = self._raw(name, info)
        if info.tensor_type.name not in DECODABLE_FORMATS or len(shape) != 2:
            return None
        part = self.file_tensor(name)[1]
        rows = None if part is None else np.arange(part.start, part.stop)  # a fused tensor's rows
        num_rows = shape[0] if rows is None else len(rows)
        expected = expected_shape(self.config, name)
        if (num_rows, shape[1]) != expected:
            raise ModelLoadError(
                f"tensor {name} of {self.path} has shape {[num_rows, shape[1]]}, "
                f"the config implies {list(expected)}"
            )
        heads = self._permuted_heads(name)
        if heads is not None:
            order = np.arange(num_rows)[:, None]
            unpermuted = unpermute_rotary_rows(order, heads)[:, 0]
            rows = unpermuted if rows is None else rows[unpermuted]
        return StoredBlocks(raw, info.tensor_type.name, (num_rows, shape[1]), rows)

    def release_blocks(self, name: str) -> None:
        self._file.release(self._info(self.stored_name(name)))

    def _permuted_heads(self, name: str) -> int | None:
        """Heads whose q/k rows llama.cpp permuted in this file, or None for any other tensor."""
        if self._arch not in _PERMUTED_ARCHITECTURES:
            return None
        if ".q_proj." in name:
            return self.config.num_heads
        if ".k_proj." in name:
            return self.config.num_kv_heads
        return None

    def _read_tensor(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        info = self._info(name)
        gguf_name = info.name
        raw, shape = self._raw(name, info)
        try:
            array = dequantize(raw, info.tensor_type).reshape(shape)
        except (NotImplementedError, ValueError) as exc:
            raise ModelLoadError(f"cannot dequantize {gguf_name} of {self.path}: {one_line(exc)}") from exc
        if self._arch in GEMMA_ARCHITECTURES and name.endswith("norm.weight"):
            array = array - 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        heads = self._permuted_heads(name)
        return array if heads is None else unpermute_rotary_rows(array, heads)

    def _raw(self, name: str, info: GGUFTensorInfo) -> tuple[np.ndarray, tuple[int, ...]]:
        """The bytes [rows, bytes a row] and shape of `name`: one expert's rows of a 3-D expert
        tensor (a contiguous byte range), else the whole tensor."""
        raw, shape = self._file.raw(info), info.shape
        expert = _EXPERT_NAME.fullmatch(name)
        if expert is not None and len(shape) == 3:
            index, shape = int(expert.group(2)), shape[1:]
            raw = raw[index * shape[0] : (index + 1) * shape[0]]
        return raw, shape

    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        path = self.path
        tokenizer: Any = cached_tokenizer(
            path,
            lambda: AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            ),
        )
        return tokenizer


def _kept_tokenizer_folder(path: Path) -> Path | None:
    folder = entry_dir(path, "tokenizer")
    return folder if (folder / "tokenizer.json").is_file() else None


def _read_hf_config(path: Path, index: GGUFFile) -> tuple[PretrainedConfig, str]:
    """transformers' config of the GGUF at `path` (through its own cache, `gguf_cache.py`),
    completed from the file's metadata, and the model id it names."""
    from transformers import AutoConfig

    arch = str(index.metadata.get("general.architecture"))
    try:
        hf_config, named = cached_config(
            path,
            lambda: AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True),
        )
    except Exception as exc:
        unsupported = re.search(r"architecture (\S+) is not supported", str(exc))
        if unsupported:
            check_architecture(unsupported.group(1), path)
        raise ModelLoadError(f"cannot read GGUF file {path}: {one_line(exc)}") from exc
    return complete_config(hf_config, arch, index.metadata, index.arrays), str(named or path.stem)


def gguf_tensor_name(name: str, architecture: str | None = None) -> str:
    """The GGUF tensor name of a canonical name (`layers.3.mlp.up_proj.weight` -> `blk.3.ffn_up.weight`)
    in a file of GGUF `architecture` (Gemma's norms are named apart)."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    expert = _EXPERT_NAME.fullmatch(name)
    if expert is not None:  # every expert of a layer lies in one 3-D tensor
        return f"blk.{expert.group(1)}.{_EXPERT_PARTS[expert.group(3)]}.weight"
    parts = _GEMMA_LAYER_PARTS if architecture in GEMMA_ARCHITECTURES else _LAYER_PARTS
    match = _LAYER_NAME.fullmatch(name)
    if match is None or match.group(2) not in parts:
        raise ModelLoadError(f"no GGUF tensor corresponds to {name}")
    layer, part, kind = match.groups()
    return f"blk.{layer}.{parts[part]}.{kind}"


def permute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's HF -> GGUF reordering of q/k projection rows (the inverse of the function below)."""
    head_dim = weight.shape[0] // num_heads
    rows = weight.reshape(num_heads, 2, head_dim // 2, *weight.shape[1:])
    return np.ascontiguousarray(rows.swapaxes(1, 2).reshape(weight.shape))


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows for the `llama` GGUF architecture.

    HF's rotary embedding rotates the two *halves* of each head (`rotate_half`: dimension j pairs
    with j + head_dim/2), while GGML's rotates *adjacent* pairs (2j with 2j+1). So llama.cpp's
    converter reorders each head's output rows from [first half | second half] to interleaved
    pairs: it views a head's rows as (2, head_dim/2) and transposes them. We view a head's GGUF
    rows as (head_dim/2, 2) and transpose back, per head (k uses the KV head count), which gives
    the HF rows exactly; the input dimension is untouched, and a bias (1-D) works the same way.
    """
    head_dim = weight.shape[0] // num_heads
    rows = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(rows.swapaxes(1, 2).reshape(weight.shape))
