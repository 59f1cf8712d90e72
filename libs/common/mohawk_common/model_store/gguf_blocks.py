"""A GGUF tensor's quantized blocks read as groupwise codes, scales and minimums (`GroupQuantized`).

The 32-weight formats (Q4_0, Q4_1, Q8_0) are unpacked here; the 5-bit formats and the K-quants
by `kquants.py`. Both give the form `quantized.py` defines, so nothing above this module asks
which GGUF type a tensor was stored in.
"""

from __future__ import annotations

import numpy as np

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store.kquants import BLOCK_LAYOUTS, decode_5bit_or_kquant
from mohawk_common.model_store.quantized import DECODABLE_FORMATS, GROUP_SIZE, GroupQuantized

# GGUF type name -> bytes of one 32-weight block
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def decode_gguf_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> GroupQuantized:
    """Codes, scales and minimums of a tensor in one of `DECODABLE_FORMATS` from its raw blocks.

    `raw` is the tensor's bytes as [rows, bytes per row]; `shape` its numpy shape [N, K].
    """
    if type_name not in DECODABLE_FORMATS:
        raise ModelLoadError(f"no groupwise decoding for GGUF type {type_name}")
    rows, cols = shape
    block_weights, block_bytes = BLOCK_LAYOUTS.get(type_name, (GROUP_SIZE, _BLOCK_BYTES.get(type_name, 0)))
    if cols % block_weights:
        raise ModelLoadError(f"a {type_name} row of {cols} weights is not whole blocks of {block_weights}")
    if type_name in BLOCK_LAYOUTS:
        blocks = np.ascontiguousarray(raw).reshape(rows, cols // block_weights, block_bytes)
        return decode_5bit_or_kquant(blocks, type_name)
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GROUP_SIZE, _BLOCK_BYTES[type_name])
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if type_name == "Q8_0":
        codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
        return GroupQuantized(codes, scales, None, 8, GROUP_SIZE, type_name)
    if type_name == "Q4_1":
        mins = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        packed = blocks[..., 4:]
    else:
        mins = -8.0 * scales
        packed = blocks[..., 2:]
    # a block's 16 bytes hold weights j (low nibble) and j + 16 (high nibble)
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1).reshape(rows, cols)
    return GroupQuantized(codes.astype(np.uint8), scales, mins, 4, GROUP_SIZE, type_name)
