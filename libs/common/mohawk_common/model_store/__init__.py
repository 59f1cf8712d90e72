"""The model store: configs, tokenizers and layer-range weights of local models (GGUF or safetensors).

    source = open_model()                      # the bundled SmolLM2-135M-Instruct
    weights = source.load_weights(0, 10, embedding=True, head=False)

Nothing here imports torch or downloads anything; weights come back as float32 numpy arrays.
"""

from mohawk_common.model_store.config import SUPPORTED_ARCHITECTURES, ModelConfig
from mohawk_common.model_store.gguf_source import GGUFSource
from mohawk_common.model_store.safetensors_source import SafetensorsSource
from mohawk_common.model_store.source import ModelSource, weight_names, weights_nbytes
from mohawk_common.model_store.store import bundled_model_path, open_model

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "GGUFSource",
    "ModelConfig",
    "ModelSource",
    "SafetensorsSource",
    "bundled_model_path",
    "open_model",
    "weight_names",
    "weights_nbytes",
]
