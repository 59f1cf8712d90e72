"""torch backend: a Llama-family layer range on CPU (fp32) or CUDA (bf16/fp16).

Its KV cache is `page_layers` pairs of K/V tensors, one block id's worth of which holds the KV of
one layer each: a model without sliding layers has one KV group and a pair per layer, as always; a
model with sliding layers has several groups sharing the pool (`mohawk_common.kv_groups`), and the
j-th layer of each group in the stage uses pair j.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import structlog
import torch

from mohawk_common.errors import ConfigError
from mohawk_common.kv_groups import group_of_layer, model_kv_groups, page_layers, tensor_slots
from mohawk_common.model_store import ModelSource
from mohawk_shard.backends.sampler import Sampler, SamplingRow
from mohawk_shard.config import engine_choice
from mohawk_shard.engine.kv_tiers import KV_CACHE_DTYPES, TierBytes, num_cold_blocks, num_hot_blocks
from mohawk_shard.engine.outputs import SampledToken
from mohawk_shard.engine.sampling_params import SamplingParams
from mohawk_shard.kernels.huge_pages import lazy_zeros
from mohawk_shard.kernels.pool_residency import RESIDENT_AFTER_S, populate_later, reuse_prefix
from mohawk_shard.model.attention_metadata import AttentionMetadata
from mohawk_shard.model.forward_batch import ForwardBatch
from mohawk_shard.model.kv_cache import Int8Store, KVCache, kv_storage_dtype
from mohawk_shard.model.kv_quant import KVTiers
from mohawk_shard.model.load_progress import POOL_MAPPED_EVENT, POOL_RESIDENT_EVENT
from mohawk_shard.model.quantized_layers import DENSE_MIN_ROWS, dense_rows
from mohawk_shard.model.rope import RotaryTable
from mohawk_shard.model.traced_decode import CUDA_BATCH_SIZES, TRACE_AFTER, TracedDecode, traceable
from mohawk_shard.model.weight_formats import weights_dtype
from mohawk_shard.model.weight_loading import build_stage

log = structlog.get_logger("mohawk.shard")
_POOL_IDS = itertools.count(1)  # names a pool in its two log lines
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
        device: str | None = None,
        dtype: str | None = None,
        weights: str | None = None,
        kv_cache_dtype: str | None = None,
        batch_invariant: bool | None = None,
        trace_decode_after: int | None = TRACE_AFTER,
    ) -> None:
        device, dtype = engine_choice("device", device), engine_choice("dtype", dtype)
        weights = engine_choice("weights", weights)
        kv_cache_dtype = engine_choice("kv_cache_dtype", kv_cache_dtype)
        batch_invariant = engine_choice("batch_invariant", batch_invariant)
        config = source.config
        self.start, self.end = start, end
        self.batch_invariant = batch_invariant
        self.has_embedding, self.has_head = start == 0, end == config.num_layers
        self.torch_device = resolve_device(device)
        self.device = str(self.torch_device)
        self.dtype = resolve_dtype(weights_dtype(weights, dtype), self.torch_device)
        self.weights = weights
        self.model, self.formats = build_stage(
            source, start, end, device=self.torch_device, dtype=self.dtype, weights=weights
        )
        hf_config = source.hf_config if config.rope_scaling is not None else None  # scaled rope only
        self.rotary = RotaryTable(config, hf_config, self.torch_device, self.dtype)
        self.kv_caches: list[KVCache] = []
        # the pool's tensors and the backend that allocated them (a shallow copy shares, never reuses)
        self._pool_pages: list[torch.Tensor] = []
        self._pool_owner: TorchBackend | None = None
        self._block_size = 0  # the pool's, once allocated
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_dtype = kv_storage_dtype(kv_cache_dtype, self.dtype)
        self.kv_groups = model_kv_groups(config)
        owner = group_of_layer(self.kv_groups, config.num_layers)
        self.layer_groups = owner[start:end]
        self.page_layers = page_layers(owner, start, end)
        self._tensor_slots = tensor_slots(owner, start, end)
        self._windows = {g: self.kv_groups[g].window for g in sorted(set(self.layer_groups))}
        if kv_cache_dtype == "int8" and (len(self.kv_groups) > 1 or self.kv_groups[0].is_sliding):
            raise ConfigError(
                "kv_cache_dtype int8 does not combine with sliding-window layers yet: use auto "
                "(a sliding layer keeps only its window's blocks, which is the bigger saving)"
            )
        self.kv_tiers: KVTiers | None = None
        self.config = config
        self.sampler = Sampler(config.eos_token_ids) if self.has_head else None
        # decodes replayed from a trace (`traced_decode.py`): batch 1 on CPU, 1-64 sequences as CUDA
        # graphs; None: always eager
        self.traced_decode: TracedDecode | None = None
        if trace_decode_after is not None and traceable(self.model, self.torch_device):
            sizes = CUDA_BATCH_SIZES if self.torch_device.type == "cuda" else (1,)
            self.traced_decode = TracedDecode(
                self.model, self.rotary, trace_decode_after, self._windows, sizes
            )

    @property
    def weight_bytes(self) -> int:
        """Bytes of parameters and buffers (packed 4-bit codes, scales), each tensor counted once."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        unique = {id(t): t for t in tensors}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def kv_tier_bytes(self, block_size: int) -> TierBytes:
        element = torch.empty((), dtype=self.kv_dtype).element_size()
        c = self.config
        return TierBytes.of(self.page_layers, c.num_kv_heads, c.head_dim, block_size, element)

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of a block as stored, or with an int8 tier the two-tier average (kv_tiers.py)."""
        tiers = self.kv_tier_bytes(block_size)
        return tiers.average if self.kv_cache_dtype == "int8" else tiers.hot

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """A KV pool of `num_blocks` blocks. Allocated again in place (a re-plan that keeps this
        backend's weights, after its stage stopped), the pool reuses its own memory where it is as
        large: resident already, so a failover's first steps write no fresh pages (8 streams'
        KV imported into 16 layers of a fresh pool took 70 ms more than into a touched one, a
        scratch script, one thread), and a survivor holds one pool, not two. A shallow copy of the
        backend (`share_weights`, a stage loaded beside the running one) never reuses the pool it
        shares: only the backend that allocated a pool reuses it."""
        two_tier = self.kv_cache_dtype == "int8"
        self._block_size = block_size
        num_hot = num_hot_blocks(num_blocks) if two_tier else num_blocks
        self.kv_tiers = KVTiers(num_blocks, block_size, num_hot, num_cold_blocks) if two_tier else None
        kv_heads, head_dim = self.config.num_kv_heads, self.config.head_dim
        held = self._own_pool() if not two_tier else []

        def zeros(num_slots: int, dtype: torch.dtype) -> torch.Tensor:  # head-major: attention.py
            shape = (kv_heads, num_slots, head_dim)
            old = held.pop() if held else None
            reused = reuse_prefix(old, shape) if old is not None and old.dtype == dtype else None
            return reused if reused is not None else lazy_zeros(*shape, dtype=dtype, device=self.torch_device)

        def int8_home() -> Int8Store | None:
            if not two_tier:
                return None
            scale = torch.zeros(num_blocks, kv_heads, dtype=torch.float32, device=self.torch_device)
            data = torch.zeros((num_blocks * block_size, kv_heads, head_dim), dtype=torch.int8)
            return Int8Store(data.to(self.torch_device), scale)

        # a spare block past the block manager's for the padding rows of recorded multi-sequence steps
        traced = self.traced_decode
        spare = int(traced is not None and traced.pads_batches and not two_tier)
        pages = [
            KVCache(
                zeros((num_hot + spare) * block_size, self.kv_dtype),
                zeros((num_hot + spare) * block_size, self.kv_dtype),
                int8_home(),
                int8_home(),
            )
            for _ in range(self.page_layers)
        ]
        self.kv_caches = [
            KVCache(page.key, page.value, page.key_int8, page.value_int8, group)
            for page, group in zip((pages[j] for j in self._tensor_slots), self.layer_groups, strict=True)
        ]
        lazy = [t for page in pages for t in (page.key, page.value)]
        self._pool_owner, self._pool_pages = self, lazy
        pool = next(_POOL_IDS)
        log.info(POOL_MAPPED_EVENT, pool=pool, mb=sum(t.numel() * t.element_size() for t in lazy) >> 20)
        populate_later(lazy, RESIDENT_AFTER_S, functools.partial(_pool_resident, pool))
        if traced is not None:
            traced.forget()
            traced.pad_block = num_hot if spare else None

    def _own_pool(self) -> list[torch.Tensor]:
        """The pool tensors this backend allocated itself, last first (none for a shallow copy);
        let go here, so the old pool is not held beside the new one."""
        if self._pool_owner is not self:
            return []
        pages, self._pool_pages = list(self._pool_pages), []
        self.kv_caches = []
        return pages[::-1]

    @property
    def carries_kv(self) -> bool:
        """Whether a sequence's KV can be copied out and in (`engine/kv_carry.py`): one full-attention
        KV group, no int8 tier, a pool allocated."""
        single = len(self.kv_groups) == 1 and not self.kv_groups[0].is_sliding
        return single and self.kv_tiers is None and bool(self.kv_caches)

    def slots(self, table: Sequence[int], lo: int, hi: int) -> torch.Tensor:
        positions = torch.arange(lo, hi)
        blocks = torch.tensor(list(table), dtype=torch.int64)[positions // self._block_size]
        return (blocks * self._block_size + positions % self._block_size).to(self.torch_device)

    def row_pool(self, num_slots: int, like: torch.Tensor) -> torch.Tensor:
        return lazy_zeros(num_slots, *like.shape[1:], dtype=like.dtype, device=like.device)

    @torch.inference_mode()
    def write_rows(self, pool: torch.Tensor, slots: np.ndarray | torch.Tensor, rows: torch.Tensor) -> None:
        index = torch.as_tensor(slots, dtype=torch.int64).to(pool.device)
        pool.index_copy_(0, index, rows.to(pool.dtype))

    @torch.inference_mode()
    def read_rows(self, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return pool.index_select(0, slots.to(pool.device)).to("cpu")

    @torch.inference_mode()
    def export_kv(self, table: Sequence[int], length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, copies of K and V [kv_heads, length, head_dim] of positions [0, length), in host
        memory (a GPU's pool is reallocated beside them)."""
        slots = self.slots(table, 0, length)
        return [
            (c.key.index_select(1, slots).to("cpu"), c.value.index_select(1, slots).to("cpu"))
            for c in self.kv_caches
        ]

    @torch.inference_mode()
    def import_kv(
        self, kv: list[tuple[torch.Tensor, torch.Tensor]], table: Sequence[int], lo: int, hi: int
    ) -> None:
        """Write positions [lo, hi) of `export_kv`'s copies into the slots `table` gives them."""
        if len(kv) != len(self.kv_caches):
            raise ValueError(f"a carry of {len(kv)} layers cannot fill layers [{self.start}, {self.end})")
        slots = self.slots(table, lo, hi)
        for cache, (key, value) in zip(self.kv_caches, kv, strict=True):
            cache.key.index_copy_(1, slots, key[:, lo:hi].to(self.torch_device, cache.key.dtype))
            cache.value.index_copy_(1, slots, value[:, lo:hi].to(self.torch_device, cache.value.dtype))

    @torch.inference_mode()
    def pack_kv(self, spans: Sequence[tuple[Sequence[int], int, int]]) -> torch.Tensor:
        """[layers, 2, kv_heads, positions, head_dim]: positions [lo, hi) of each (table, lo, hi),
        laid end to end, in host memory (`engine/kv_mirror.py`)."""
        slots = torch.cat([self.slots(table, lo, hi) for table, lo, hi in spans])
        return torch.stack(
            [
                torch.stack((c.key.index_select(1, slots), c.value.index_select(1, slots)))
                for c in self.kv_caches
            ]
        ).to("cpu")

    def split_kv(self, packed: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
        """`packed` (a mirror that came here) cut into each sequence's positions, in host memory."""
        return list(packed.to("cpu").split(list(sizes), dim=3))

    def join_kv(self, pieces: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`export_kv`'s form (per layer, K and V [kv_heads, positions, head_dim]) of pieces in order."""
        whole = torch.cat(list(pieces), dim=3)
        return [(layer[0], layer[1]) for layer in whole]

    def join_rows(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """Rows laid end to end on this stage's device (carried ones come from host memory)."""
        return torch.cat([row.to(self.torch_device) for row in rows])

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, hidden: torch.Tensor | None) -> torch.Tensor:
        if len(self._windows) > 1 and not batch.group_tables:
            raise ValueError(f"layers [{self.start}, {self.end}) need a block table per KV group")
        if self.has_embedding:
            inputs = torch.from_numpy(batch.token_ids).to(self.torch_device)
        elif hidden is None:
            raise ValueError("a stage without the embedding needs hidden states from the stage before")
        else:
            inputs = hidden.to(self.torch_device, self.dtype)
        traced = self.traced_decode
        if traced is not None and self.batch_invariant and self.kv_tiers is None and traced.applies(batch):
            return traced.step(batch, inputs, self.kv_caches, self._eager)
        return self._eager(batch, inputs)

    def _eager(self, batch: ForwardBatch, inputs: torch.Tensor) -> torch.Tensor:
        plan = None if self.kv_tiers is None else self.kv_tiers.prepare(batch, self.kv_caches)
        meta = AttentionMetadata.build(
            batch, self.rotary, self.torch_device, plan, self._windows, fixed_chunks=self.batch_invariant
        )
        rows = None
        if self.has_head and batch.logits_rows.shape[0] != batch.num_tokens:
            rows = torch.from_numpy(np.ascontiguousarray(batch.logits_rows)).to(self.torch_device)
        # batch invariant: every row on the 4-bit kernel (`quantized_layers` says why)
        dense = not self.batch_invariant and batch.num_tokens >= DENSE_MIN_ROWS
        with dense_rows(batch.num_tokens if dense else None):
            out = self.model(inputs, meta, self.kv_caches, rows)
        if self.kv_tiers is not None:
            self.kv_tiers.settle(batch, self.kv_caches)
        return out

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


def _pool_resident(pool: int, populated: int, seconds: float) -> None:
    """`populate_later`'s report: the KV pool is resident (`LocalCluster.wait_pools_resident` reads it)."""
    log.info(POOL_RESIDENT_EVENT, pool=pool, mb=populated >> 20, seconds=round(seconds, 2))
