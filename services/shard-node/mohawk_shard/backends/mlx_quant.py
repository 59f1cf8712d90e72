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
through `mx.quantize`. The blocks come from the model store (`source.read_quantized`: codes,
scales and minimums, rows already in HF order), and the formats from `source.stored_format`.
MLX holds `bits` in 2, 3, 4, 6 or 8 and groups of 32, 64 or 128, so of the other GGUF types:
Q4_K is eight groups of 32 with 4-bit codes, scale `d·sc` and bias `−dmin·m`: held 4-bit, exactly;
Q5_0, Q5_1 and Q5_K have groups of 32 with 5-bit codes, which MLX has no width for: held 8-bit,
exactly (the same scale and bias, the codes zero-extended: more bits than the file, never fewer);
Q6_K's groups are 16 weights, which no MLX group size holds (a group of 32 would need one scale
for two of its sub-blocks): like any other type with no exact form here, it is held dequantized in
the compute dtype, and the stage says so in its log.

Exact also depends on the dtype MLX keeps scales and biases in, the stage's compute dtype. The
plain blocks' d and m are fp16 numbers (11 significant bits; −8·d and −128·d only shift the
exponent); a K-quant's d·sc and dmin·m are an fp16 times a 6-bit integer, up to 17 bits. float32
(24 bits, the MLX default) holds both exactly; float16 (11) holds the plain blocks but not the
K-quants; bfloat16 (8) holds neither. Where the stage's dtype rounds a format's scales, the weight
stays in its bits with the scales rounded to that dtype (`scale_rounding` says so, in the stage's
log and in `mohawk model inspect`), as a torch stage's bf16 tinygemm scales are: holding it
dequantized instead would round every weight to the same dtype and cost 2-4x the memory. It never
requantizes to fewer bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import ModelSource
from mohawk_common.model_store.quantized import GROUP_SIZE, GroupQuantized
from mohawk_common.model_store.source import EMBEDDING, LM_HEAD
from mohawk_shard.model.weight_formats import FLOAT_FORMATS

# one MLX group is one GGUF block (GROUP_SIZE weights)
# stored formats MLX holds exactly, and the bits it holds them in (Q5_x's 5-bit codes in 8 bits)
_EXACT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 8, "Q5_1": 8, "Q5_K": 8, "Q8_0": 8}
# significant bits each format's scales and biases need, and what each scale dtype holds
_SCALE_BITS = {"Q4_0": 11, "Q4_1": 11, "Q5_0": 11, "Q5_1": 11, "Q8_0": 11, "Q4_K": 17, "Q5_K": 17}
_MANTISSA_BITS = {"float32": 24, "float16": 11, "bfloat16": 8}


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


def chosen_bits(name: str, stored: str, weights: str) -> int | None:
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


def has_no_kernel(stored: str) -> bool:
    """A quantized stored format MLX cannot hold as it is (held dequantized, which the stage logs)."""
    return stored not in _EXACT_BITS and stored not in FLOAT_FORMATS


def held_bits(name: str, stored: str, columns: int, weights: str) -> tuple[int | None, str | None]:
    """How an MLX stage holds weight `name` of `columns` columns: its bits (None: the compute dtype)
    and, where that is not what `weights` asked for, why. The stage logs the reason and `mohawk
    model inspect` shows it; both take it from here."""
    bits = chosen_bits(name, stored, weights)
    if bits is not None and columns % GROUP_SIZE:
        return None, f"rows are not whole groups of {GROUP_SIZE}"
    if bits is None and has_no_kernel(stored):
        return None, f"no MLX kernel for {stored}"
    return bits, None


def scale_rounding(stored: str, scales_dtype: str) -> str | None:
    """Where `scales_dtype` (the stage's compute dtype) cannot hold a `stored` format's scales and
    biases exactly, what rounding them costs; None where it holds them exactly."""
    need, have = _SCALE_BITS.get(stored, 0), _MANTISSA_BITS.get(scales_dtype, 24)
    if need <= have:
        return None
    return f"{stored} scales need {need} significant bits, {scales_dtype} holds {have}: rounded"


def quantize_weight(source: ModelSource, name: str, bits: int, dtype: mx.Dtype) -> QuantizedWeight:
    """`name` held `bits`-bit: the file's own blocks where it has them, else `mx.quantize`."""
    if _EXACT_BITS.get(source.stored_format(name)) == bits:
        return from_stored(source, name, dtype)
    weight, scales, biases = mx.quantize(
        mx.array(source.read_tensor(name)).astype(dtype), group_size=GROUP_SIZE, bits=bits
    )
    return QuantizedWeight(bits, weight, scales, biases)


def from_stored(source: ModelSource, name: str, dtype: mx.Dtype) -> QuantizedWeight:
    """A tensor of the file in one of `_EXACT_BITS`' formats as MLX affine groups of 32, exactly."""
    tensor = source.read_quantized(name)
    if tensor is None:
        raise ModelLoadError(f"{source.path}: {name} is stored groupwise but its blocks cannot be read")
    bits = _EXACT_BITS[tensor.source_format]
    values, scales, biases = affine_groups(tensor)
    return QuantizedWeight(
        bits,
        mx.array(pack(values, bits)),
        mx.array(scales).astype(dtype),
        mx.array(biases).astype(dtype),
    )


def affine_groups(tensor: GroupQuantized) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unsigned integers [rows, columns], scales, biases [rows, groups]) with w = scale·q + bias:
    codes with minimums are unsigned already, bias the minimum; signed codes q (Q8_0, Q5_0)
    become q + 128, with bias −128·scale."""
    if tensor.mins is not None:
        return tensor.codes.astype(np.uint8), tensor.scales, tensor.mins
    if tensor.codes.dtype != np.int8:
        raise ValueError(f"symmetric codes must be int8, got {tensor.codes.dtype}")
    values = (tensor.codes.astype(np.int16) + 128).astype(np.uint8)
    return values, tensor.scales, -128.0 * tensor.scales


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `bits`-bit integers [rows, columns] packed as MLX does: 32 / bits a uint32, the
    first in the lowest bits."""
    per_word = 32 // bits
    words = values.reshape(values.shape[0], -1, per_word).astype(np.uint32)
    shifts = (bits * np.arange(per_word, dtype=np.uint32)).astype(np.uint32)
    return np.bitwise_or.reduce(words << shifts, axis=-1)
