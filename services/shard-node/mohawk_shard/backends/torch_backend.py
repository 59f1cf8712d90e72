"""torch backend: a Llama-family layer range on CPU (fp32) or CUDA (bf16/fp16)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mohawk_common.errors import ConfigError
from mohawk_common.model_store import ModelSource
from mohawk_shard.backends.batch import ForwardBatch
from mohawk_shard.backends.sampler import Sampler, SamplingRow
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.model.attention import AttentionMetadata, KVCache
from mohawk_shard.model.linear import prefers_transposed
from mohawk_shard.model.llama import LlamaStage
from mohawk_shard.model.rope import RotaryTable

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


class TorchBackend:
    name = "torch"

    def __init__(
        self,
        source: ModelSource,
        start: int,
        end: int,
        *,
        device: str = "auto",
        dtype: str = "auto",
        weights: str = "native",
    ) -> None:
        config = source.config
        self.start, self.end = start, end
        self.has_embedding, self.has_head = start == 0, end == config.num_layers
        self.torch_device = resolve_device(device)
        self.device = str(self.torch_device)
        self.dtype = resolve_dtype(dtype, self.torch_device)
        tensors = source.load_weights(start, end, embedding=self.has_embedding, head=self.has_head)
        with torch.device("meta"):
            model = LlamaStage(config, start, end, embedding=self.has_embedding, head=self.has_head)
        self.model = model.to(self.dtype).to_empty(device=self.torch_device)
        self.model.tie_weights()
        self.model.load_weights(tensors)
        del tensors
        self.weights = weights
        if prefers_transposed(self.torch_device, self.dtype):
            self.model.store_linear_weights_transposed()
        self.rotary = RotaryTable(config, source.hf_config, self.torch_device, self.dtype)
        self.kv_caches: list[KVCache] = []
        self.config = config
        self.sampler = Sampler(config.eos_token_ids) if self.has_head else None

    @property
    def weight_bytes(self) -> int:
        unique = {id(p): p for p in self.model.parameters()}
        return sum(p.numel() * p.element_size() for p in unique.values())

    def kv_bytes_per_block(self, block_size: int) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        per_slot = 2 * self.config.num_kv_heads * self.config.head_dim * element
        return (self.end - self.start) * block_size * per_slot

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        shape = (num_blocks * block_size, self.config.num_kv_heads, self.config.head_dim)
        self.kv_caches = [
            KVCache(
                torch.zeros(shape, dtype=self.dtype, device=self.torch_device),
                torch.zeros(shape, dtype=self.dtype, device=self.torch_device),
            )
            for _ in range(self.start, self.end)
        ]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, hidden: torch.Tensor | None) -> torch.Tensor:
        meta = AttentionMetadata.build(batch, self.rotary, self.torch_device)
        if self.has_embedding:
            inputs = torch.from_numpy(batch.token_ids).to(self.torch_device)
        elif hidden is None:
            raise ValueError("a stage without the embedding needs hidden states from the stage before")
        else:
            inputs = hidden.to(self.torch_device, self.dtype)
        rows = None
        if self.has_head and batch.logits_rows.shape[0] != batch.num_tokens:
            rows = torch.from_numpy(np.ascontiguousarray(batch.logits_rows)).to(self.torch_device)
        return self.model(inputs, meta, self.kv_caches, rows)

    def sample(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]
    ) -> list[SampledToken]:
        if self.sampler is None:
            raise ValueError("only the last stage samples")
        rows = [SamplingRow(p, o) for p, o in zip(params, outputs, strict=True)]
        return self.sampler.sample(logits, rows)

    def encode_hidden(self, hidden: torch.Tensor) -> tuple[str, list[int], bytes]:
        return tensor_to_bytes(hidden)

    def decode_hidden(self, dtype: str, shape: Sequence[int], data: bytes) -> torch.Tensor:
        return tensor_from_bytes(dtype, shape, data, self.torch_device)


def tensor_to_bytes(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    """(dtype name, shape, raw little-endian bytes) of a CPU or GPU tensor, with no Python lists."""
    name = _NAMES.get(tensor.dtype)
    if name is None:
        raise ValueError(f"hidden states of dtype {tensor.dtype} cannot cross the wire")
    flat = tensor.detach().contiguous().to("cpu").reshape(-1)
    return name, list(tensor.shape), flat.view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(dtype: str, shape: Sequence[int], data: bytes, device: torch.device) -> torch.Tensor:
    torch_dtype = _DTYPES.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"unknown hidden-state dtype {dtype!r}")
    raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    return raw.view(torch_dtype).reshape(tuple(shape)).to(device)
