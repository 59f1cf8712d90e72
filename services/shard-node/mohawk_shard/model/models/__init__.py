"""One module per decoder architecture, and the registry the loader builds stages from."""

from __future__ import annotations

from mohawk_common.errors import ModelLoadError
from mohawk_shard.model.models.gemma import GemmaStage
from mohawk_shard.model.models.llama import LlamaStage
from mohawk_shard.model.models.mixtral import MixtralStage
from mohawk_shard.model.models.phi3 import Phi3Stage
from mohawk_shard.model.models.qwen3_moe import Qwen3MoEStage
from mohawk_shard.model.stage import DecoderStage

STAGE_CLASSES: dict[str, type[DecoderStage]] = {
    "llama": LlamaStage,
    "mistral": LlamaStage,
    "qwen2": LlamaStage,
    "qwen3": LlamaStage,
    "phi3": Phi3Stage,
    "gemma2": GemmaStage,
    "gemma3_text": GemmaStage,
    "mixtral": MixtralStage,
    "qwen3_moe": Qwen3MoEStage,
}


def stage_class(architecture: str) -> type[DecoderStage]:
    """The stage class of a `ModelConfig.architecture`."""
    cls = STAGE_CLASSES.get(architecture)
    if cls is None:
        raise ModelLoadError(f"the torch backend has no model for architecture {architecture!r}")
    return cls


__all__ = [
    "STAGE_CLASSES",
    "DecoderStage",
    "GemmaStage",
    "LlamaStage",
    "MixtralStage",
    "Phi3Stage",
    "Qwen3MoEStage",
    "stage_class",
]
