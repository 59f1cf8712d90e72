"""Weight formats of an MLX stage: which matmul weights are held 4- or 8-bit, and their MLX arrays.

Design. MLX's affine quantization holds a weight as unsigned `bits`-bit integers q packed into
uint32 words, plus one scale s and one bias b per group of `group_size` consecutive inputs of a
row: w = s·q + b. llama.cpp's blocks are the same thing with 32 weights a block: Q4_1 is
w = d·q + m (q in 0…15), Q4_0 is w = d·(q − 8), Q8_0 is w = d·q (q in −128…127, i.e.
d·(q + 128) − 128·d). So a GGUF tensor in one of these types becomes an MLX quantized tensor of
group size 32 exactly, by unpacking its blocks' integers and repacking them in MLX's order, with
scales d and biases m (or −8·d, −128·d): no rounding at all in float32. This matters:
`mx.quantize` on the dequantized values does *not* give the GGUF values back, because it picks
its scale so that the group's value of largest magnitude is exact, not its minimum (measured on
SmolLM2's Q4_1 layers: a max abs error of 0.086, 4% of the largest weight). Only weights with no
GGUF blocks to copy (`int4` on a safetensors file, or on float or 8-bit layers of a GGUF file) go
through `mx.quantize`. The blocks are read from the GGUF file's tensor bytes, rows put back in HF
order the way the source does it for `llama` files (q/k rotary rows: groups run along a row, so a
row's groups move with it). Any other quantized GGUF type (K-quants, …) has no kernel here: its
dequantized values are held in the compute dtype, and the stage says so in its log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import mlx.core as mx
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.gguf_source import (
    _PERMUTED_ARCHITECTURES,
    GGUFSource,
    gguf_tensor_name,
    unpermute_rotary_rows,
)
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD
from mohawk_shard.config import WeightsMode

GROUP_SIZE = 32  # GGUF's block length, so one MLX group is one GGUF block
WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightsMode)
# GGUF block types MLX holds exactly, and the bits it holds them in
_EXACT_BITS = {GGMLQuantizationType.Q4_0: 4, GGMLQuantizationType.Q4_1: 4, GGMLQuantizationType.Q8_0: 8}
_FLOAT_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16})


@dataclass(frozen=True)
class QuantizedWeight:
    """One matmul weight in MLX's affine form: packed integers, and a scale and bias per group."""

    bits: int
    weight: mx.array  # uint32 [rows, columns · bits / 32]
    scales: mx.array  # [rows, columns / GROUP_SIZE]
    biases: mx.array

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes + self.scales.nbytes + self.biases.nbytes)

    def dequantize(self) -> mx.array:
        return mx.dequantize(self.weight, self.scales, self.biases, group_size=GROUP_SIZE, bits=self.bits)


def is_matmul_weight(name: str) -> bool:
    """Canonical names of the weights a quantized kernel can hold (projections, embedding, head)."""
    return name.endswith("_proj.weight") or name in (EMBEDDING, LM_HEAD)


def stored_type(source: ModelSource, name: str) -> GGMLQuantizationType | None:
    """The GGUF type a canonical tensor is stored in (a tied head is the embedding), None if not GGUF."""
    if not isinstance(source, GGUFSource):
        return None
    if name == LM_HEAD and source.config.tie_word_embeddings:
        name = EMBEDDING
    info = source._file.tensors.get(gguf_tensor_name(name))
    return None if info is None else info.tensor_type


def chosen_bits(name: str, stored: GGMLQuantizationType | None, weights: str) -> int | None:
    """Bits to hold a matmul weight in under weight format `weights`, or None for the compute dtype.

    GGUF Q4_0/Q4_1/Q8_0 tensors keep their blocks (native and int4); with int4 every other
    projection is quantized to 4 bits too, while an embedding or LM head not stored in blocks
    stays in the compute dtype (a 4-bit vocabulary matrix costs more quality than it saves)."""
    if weights in ("bf16", "fp32") or not is_matmul_weight(name):
        return None
    if stored in _EXACT_BITS:
        return _EXACT_BITS[stored]
    if weights == "int4" and name.endswith("_proj.weight"):
        return 4
    return None


def has_no_kernel(stored: GGMLQuantizationType | None) -> bool:
    """A quantized GGUF type MLX cannot hold as it is (held dequantized, which the stage logs)."""
    return stored is not None and stored not in _EXACT_BITS and stored not in _FLOAT_TYPES


def quantize_weight(
    source: ModelSource, name: str, dequantized: np.ndarray, bits: int, dtype: mx.Dtype
) -> QuantizedWeight:
    """`name` held `bits`-bit: the GGUF blocks themselves where it has them, else `mx.quantize`."""
    stored = stored_type(source, name)
    if isinstance(source, GGUFSource) and stored in _EXACT_BITS and _EXACT_BITS[stored] == bits:
        return from_gguf_blocks(source, name, dtype)
    weight, scales, biases = mx.quantize(
        mx.array(dequantized).astype(dtype), group_size=GROUP_SIZE, bits=bits
    )
    return QuantizedWeight(bits, weight, scales, biases)


def from_gguf_blocks(source: GGUFSource, name: str, dtype: mx.Dtype) -> QuantizedWeight:
    """A Q4_0/Q4_1/Q8_0 tensor of a GGUF file as MLX affine groups of 32, exactly."""
    tensor = EMBEDDING if name == LM_HEAD and source.config.tie_word_embeddings else name
    info = source._file.tensors[gguf_tensor_name(tensor)]
    bits = _EXACT_BITS[info.tensor_type]
    values, scales, biases = unpack_blocks(source._file.raw(info), info.tensor_type)
    if source._file.metadata.get("general.architecture") in _PERMUTED_ARCHITECTURES:
        heads = {".q_proj.": source.config.num_heads, ".k_proj.": source.config.num_kv_heads}
        for part, num_heads in heads.items():
            if part in name:
                arrays = (values, scales, biases)
                values, scales, biases = (unpermute_rotary_rows(a, num_heads) for a in arrays)
    return QuantizedWeight(
        bits,
        mx.array(pack(values, bits)),
        mx.array(scales).astype(dtype),
        mx.array(biases).astype(dtype),
    )


def unpack_blocks(
    raw: np.ndarray, tensor_type: GGMLQuantizationType
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF blocks ([rows, bytes per row]) as (unsigned integers [rows, columns], scales, biases
    [rows, blocks]) with w = scale·q + bias; a block is fp16 d (and fp16 m for Q4_1), then the
    integers: Q8_0 one int8 each, Q4 two a byte, weight i in the low nibble of byte i and
    weight i + 16 in its high nibble."""
    type_size = GGML_QUANT_SIZES[tensor_type][1]
    blocks = raw.reshape(raw.shape[0], -1, type_size)
    d = _fp16(blocks[..., 0:2])
    if tensor_type == GGMLQuantizationType.Q8_0:
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q.reshape(raw.shape[0], -1), d, -128.0 * d
    if tensor_type == GGMLQuantizationType.Q4_1:
        nibbles, m = blocks[..., 4:], _fp16(blocks[..., 2:4])
    elif tensor_type == GGMLQuantizationType.Q4_0:
        nibbles, m = blocks[..., 2:], -8.0 * d
    else:
        raise ValueError(f"GGUF type {tensor_type.name} has no exact MLX form")
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    return q.reshape(raw.shape[0], -1), d, m.astype(np.float32)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `bits`-bit integers [rows, columns] packed as MLX does: 32 / bits a uint32, the
    first in the lowest bits."""
    per_word = 32 // bits
    words = values.reshape(values.shape[0], -1, per_word).astype(np.uint32)
    shifts = (bits * np.arange(per_word, dtype=np.uint32)).astype(np.uint32)
    return np.bitwise_or.reduce(words << shifts, axis=-1)


def _fp16(pair: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from [..., 2] bytes, as float32 [...]."""
    return np.ascontiguousarray(pair).view(np.float16)[..., 0].astype(np.float32)
