"""What a node's weights cost in memory, for its heartbeat (the coordinator plans from these).

A decoder layer's bytes are measured on the one-layer backend the node builds to time itself
(`Backend.weight_bytes`, node/capacity.py); the embedding and the final norm + LM head are not
built there, so they are computed here from the model's shape. Pure functions: no array library.
"""

from __future__ import annotations

from dataclasses import dataclass

from mohawk_common.model_store import ModelSource

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class StageWeightBytes:
    """Bytes of the embedding (stage 0) and of the final norm + LM head (last stage)."""

    embedding: int
    head: int


def compute_dtype(dtype: str, device: str) -> str:
    """The dtype a backend computes in for the settings' `dtype` (auto: bf16 on CUDA, fp32 elsewhere)."""
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def stage_weight_bytes(source: ModelSource, weights: str, dtype: str) -> StageWeightBytes:
    """Embedding and head bytes as a node with weight format `weights` and compute dtype `dtype`
    (resolved, e.g. "float32") holds them.

    For now every format keeps these two matrices in the compute dtype: vocab × hidden elements
    each, plus `hidden` for the final norm; the head is counted in full even when tied to the
    embedding, since the last stage holds its own copy. `weights` is the hook for formats that keep
    them quantized.
    """
    config = source.config
    element = ELEMENT_BYTES.get(dtype, 4)
    matrix = config.vocab_size * config.hidden_size * element
    return StageWeightBytes(embedding=matrix, head=matrix + config.hidden_size * element)


def weights_format(weights: str, dtype: str) -> str:
    """The format the node's weights are held in, for operators: the `weights` setting, or for
    `native` (weights as the file stores them, dequantized today) the compute dtype."""
    return dtype if weights == "native" else weights
