"""`ModelSource`: one model on disk, read a layer range at a time under canonical tensor names.

Every source maps the same canonical names (those of a Hugging Face Llama state dict without the
`model.` prefix) onto its own file format; this base class decides which names a layer range
needs, checks every tensor's shape against the config, and returns float32 C-contiguous arrays
in HF orientation `[out_features, in_features]`. Subclasses only read one named tensor.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.config import ModelConfig
from mohawk_common.model_store.quantized import GroupQuantized, StoredBlocks

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

EMBEDDING = "embed_tokens.weight"
FINAL_NORM = "norm.weight"
LM_HEAD = "lm_head.weight"


class ModelSource(ABC):
    """A model's config, tokenizer and weights, read lazily from local files."""

    path: Path
    config: ModelConfig
    # whether the files hold the checkpoint's own fused tensors (`fused_part`); a slice package
    # holds the canonical ones
    stores_fused = True

    def __init__(self, path: Path, config: ModelConfig, hf_config: PretrainedConfig | None) -> None:
        self.path = path
        self.config = config
        self._hf_config = hf_config
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._tokenizer_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, model_id={self.config.model_id!r})"

    def load_decoder(self) -> Any:
        """The tokenizer for a stage that turns ids into text: `decode` without transformers where
        the source can (a GGUF opened before), the whole tokenizer behind it (`token_decoder.py`)."""
        return self.load_tokenizer()

    @property
    def hf_config(self) -> PretrainedConfig:
        """transformers' config of the model, read on first use: a stage needs it only for rope
        scaling (`config.rope_scaling`), so a process serving a cached GGUF never imports transformers
        to start."""
        if self._hf_config is None:
            self._hf_config = self._load_hf_config()
        return self._hf_config

    def _load_hf_config(self) -> PretrainedConfig:
        raise ModelLoadError(f"{self.path}: this source has no transformers config")

    def load_tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer, with its chat template; loaded once, then cached on the source."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = self._load_tokenizer()
                except Exception as exc:
                    raise ModelLoadError(
                        f"cannot load the tokenizer of {self.path}: {one_line(exc)}"
                    ) from exc
            return self._tokenizer

    def load_weights(self, start: int, end: int, *, embedding: bool, head: bool) -> dict[str, np.ndarray]:
        """Read layers `[start, end)` (plus the embedding and/or final norm + LM head) as float32.

        Only the named tensors are read. For tied-embedding models `lm_head.weight` is the
        embedding matrix; when both are asked for, the two keys share one array.
        """
        self.check_range(start, end)
        weights: dict[str, np.ndarray] = {}
        for name in weight_names(self.config, start, end, embedding=embedding, head=head):
            stored = self.stored_name(name)
            weights[name] = weights[stored] if stored in weights else self._checked(stored)
        return weights

    def check_range(self, start: int, end: int) -> None:
        """ModelLoadError unless `[start, end)` is a non-empty range of the model's layers."""
        if not 0 <= start < end <= self.config.num_layers:
            raise ModelLoadError(
                f"invalid layer range [{start}, {end}) for {self.config.model_id} "
                f"({self.config.num_layers} layers)"
            )

    def stored_name(self, name: str) -> str:
        """The canonical name a tensor is read from: a tied model's LM head is its embedding matrix."""
        return EMBEDDING if name == LM_HEAD and self.config.tie_word_embeddings else name

    def file_tensor(self, name: str) -> tuple[str, FusedPart | None]:
        """The canonical name the file keeps `name` under, and the rows to take when that is fused."""
        name = self.stored_name(name)
        part = fused_part(self.config, name) if self.stores_fused else None
        return (name, None) if part is None else (part.name, part)

    def read_tensor(self, name: str) -> np.ndarray:
        """One tensor by canonical name: float32, C-contiguous, in HF orientation, shape checked."""
        return self._checked(self.stored_name(name))

    def stored_format(self, name: str) -> str:
        """How the file stores a tensor: a GGUF type name (`Q4_1`, `Q8_0`, `F16`, ...) or a dtype."""
        return "F32"

    def stored_shape(self, name: str) -> tuple[int, ...] | None:
        """A tensor's shape as the file's index states it (HF orientation), or None where the
        source has no index to read it from; ModelLoadError when the file lacks the tensor."""
        return None

    def check_tensors(self) -> None:
        """Every tensor the config implies is in the file, with the shape it implies, judged from
        the file's index alone (no tensor is read); else a `ModelLoadError` naming the file, the
        tensor and the shape expected."""
        config = self.config
        for name in weight_names(config, 0, config.num_layers, embedding=True, head=True):
            stored, part = self.file_tensor(name)
            shape = self.stored_shape(stored)
            if shape is not None and part is not None:  # the rows a fused tensor holds it in
                shape = (min(shape[0], part.stop) - part.start, *shape[1:])
            expected = expected_shape(config, self.stored_name(name))
            if shape is not None and tuple(shape) != expected:
                raise ModelLoadError(
                    f"tensor {self.stored_name(name)} of {self.path} has shape {list(shape)}, "
                    f"the config implies {list(expected)}"
                )

    def read_quantized(self, name: str) -> GroupQuantized | None:
        """A tensor's own groupwise codes when the file stores it in a format `quantized.py` decodes
        (Q4_0, Q4_1, Q8_0), else None. Rows are in HF orientation, as `read_tensor` gives them."""
        return None

    def read_blocks(self, name: str) -> StoredBlocks | None:
        """A quantized tensor's blocks as stored (a view of the file, no copy), for the compiled
        kernels' repacking; None where the source has no such view (then `read_quantized`)."""
        return None

    def release_blocks(self, name: str) -> None:
        """A loader is done with `name`'s stored blocks (`read_blocks`): a mapped source drops their
        pages from the process's memory, so a load never holds the file and its repacked copy at
        once. Nothing to drop by default."""
        return None

    def _checked(self, name: str) -> np.ndarray:
        stored, part = self.file_tensor(name)
        array = self._read_tensor(stored)
        if part is not None:
            array = array[part.start : part.stop]
        expected = expected_shape(self.config, name)
        if array.shape != expected:
            raise ModelLoadError(
                f"tensor {name} of {self.path} has shape {list(array.shape)}, "
                f"the config implies {list(expected)}"
            )
        if array.dtype != np.float32 or not array.flags.c_contiguous or not array.flags.writeable:
            array = np.array(array, dtype=np.float32, order="C")
        return array

    @abstractmethod
    def _read_tensor(self, name: str) -> np.ndarray:
        """Read one tensor by canonical name, dequantized, in HF orientation."""

    @abstractmethod
    def _load_tokenizer(self) -> PreTrainedTokenizerBase:
        """Build the tokenizer from the model's own files (never from a hub)."""


def layer_names(config: ModelConfig, layer: int) -> list[str]:
    """Canonical names of one decoder layer's tensors."""
    prefix = f"layers.{layer}."
    names = ["input_layernorm.weight"]
    names += [f"self_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")]
    if config.attention_bias:
        names += [f"self_attn.{p}_proj.bias" for p in ("q", "k", "v")]
    if config.qk_norm:
        names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    names += ["post_attention_layernorm.weight"]
    if config.num_layer_norms == 4:  # Gemma: norms before and after the MLP too
        names += ["pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
    if config.is_moe_layer(layer):  # the router, then every expert's SwiGLU
        names += ["mlp.gate.weight"]
        names += [
            f"mlp.experts.{e}.{p}_proj.weight"
            for e in range(config.num_experts)
            for p in ("gate", "up", "down")
        ]
    else:
        names += [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    return [prefix + name for name in names]


@dataclass(frozen=True, slots=True)
class FusedPart:
    """Rows [start, stop) of the fused tensor `name` that a checkpoint stores a canonical tensor in."""

    name: str
    start: int
    stop: int


# Phi-3 checkpoints store q/k/v as one qkv_proj and gate/up as one gate_up_proj
_FUSED_ARCHITECTURES = frozenset({"phi3"})


def fused_part(config: ModelConfig, name: str) -> FusedPart | None:
    """Where a file of `config`'s architecture keeps canonical tensor `name` inside a fused one; None
    when it stores it under its own name. Sources split at read time, so loaders see canonical names."""
    if config.architecture not in _FUSED_ARCHITECTURES or not name.endswith(".weight"):
        return None
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    rows = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q_size),
        "self_attn.k_proj": ("self_attn.qkv_proj", q_size, q_size + kv_size),
        "self_attn.v_proj": ("self_attn.qkv_proj", q_size + kv_size, q_size + 2 * kv_size),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, 2 * inter),
    }
    prefix, _, part = name.removesuffix(".weight").partition(".")
    layer, _, module = part.partition(".")
    if prefix != "layers" or module not in rows:
        return None
    fused, start, stop = rows[module]
    return FusedPart(f"layers.{layer}.{fused}.weight", start, stop)


def weight_names(config: ModelConfig, start: int, end: int, *, embedding: bool, head: bool) -> list[str]:
    """Canonical names `load_weights(start, end, embedding=..., head=...)` returns, in order."""
    names = [EMBEDDING] if embedding else []
    for layer in range(start, end):
        names += layer_names(config, layer)
    return names + ([FINAL_NORM, LM_HEAD] if head else [])


def expected_shape(config: ModelConfig, name: str) -> tuple[int, ...]:
    """The shape the config implies for a canonical tensor name."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    if name in (EMBEDDING, LM_HEAD):
        return (config.vocab_size, hidden)
    if ".mlp.experts." in name:  # one expert's gate/up/down
        inter = config.moe_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "norm.weight": (hidden,),
        "layernorm.weight": (hidden,),
        "q_proj.weight": (q_size, hidden),
        "k_proj.weight": (kv_size, hidden),
        "v_proj.weight": (kv_size, hidden),
        "o_proj.weight": (hidden, q_size),
        "q_proj.bias": (q_size,),
        "k_proj.bias": (kv_size,),
        "v_proj.bias": (kv_size,),
        "q_norm.weight": (config.head_dim,),
        "k_norm.weight": (config.head_dim,),
        "gate_proj.weight": (inter, hidden),
        "up_proj.weight": (inter, hidden),
        "down_proj.weight": (hidden, inter),
        "gate.weight": (config.num_experts, hidden),  # a MoE layer's router
    }
    leaf = ".".join(name.rsplit(".", 2)[-2:])
    leaf = "layernorm.weight" if leaf.endswith("layernorm.weight") else leaf
    return shapes[leaf]


def weights_nbytes(weights: dict[str, Any]) -> int:
    """Bytes held by a `load_weights` result, counting an array shared by two keys once."""
    return sum(array.nbytes for array in {id(a): a for a in weights.values()}.values())


def one_line(exc: BaseException) -> str:
    """An exception's message cut to its first line, for a one-line `ModelLoadError`."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
