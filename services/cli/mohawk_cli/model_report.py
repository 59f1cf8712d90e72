"""What `mohawk model inspect` says about a model file, decided the way the loader and planner decide.

Design. Nothing here chooses a format. Each torch matmul and token table is held as
`weight_formats.py` decides from the file alone (the loader builds those decisions), the bytes of
a stage's embedding and head are `footprint.py`'s (the numbers a node's heartbeat gives the
planner), and MLX's choice per weight is `mlx_quant.held_bits`. A decoder layer's bytes, which a
node measures on the one-layer stage it times, are summed from the same decisions: each matmul is
`footprint.matmul_bytes` of the format it is held in, norms and biases dense in the compute dtype. The
stored types and bytes come from the file's own index (GGUF: `GGUFFile`; safetensors: its
headers), so no tensor is read: a report on a 70B file costs what one on SmolLM2 does.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType

from mohawk_common.errors import ModelLoadError
from mohawk_common.model_store import GGUFSource, ModelSource, SafetensorsSource
from mohawk_common.model_store.gguf_file import GGUFFile, can_dequantize
from mohawk_common.model_store.quantized import DECODABLE_FORMATS
from mohawk_common.model_store.safetensors_source import read_header, weight_files
from mohawk_common.model_store.source import EMBEDDING, FINAL_NORM, LM_HEAD, expected_shape, layer_names
from mohawk_shard.model.footprint import (
    ELEMENT_BYTES,
    compute_dtype,
    matmul_bytes,
    stage_weight_bytes,
)
from mohawk_shard.model.weight_formats import (
    DENSE,
    FLOAT_FORMATS,
    GROUPWISE_TABLES,
    MatmulFormat,
    embedding_format,
    head_is_rescored,
    head_is_split,
    layer_matmul_formats,
    layer_matmuls,
    matmul_format,
    weights_dtype,
)

TORCH_DEVICES = ("cpu", "cuda")
LAYER_MATMULS_PART = "layer matmuls"
NORMS_PART = "norms and biases"
MOE_PART = "moe experts and routers"  # experts held as any matmul is, routers dense (`moe.py`)
_LAYER_PREFIX = re.compile(r"\blayers\.\d+\.")


@dataclass(frozen=True, slots=True)
class StoredType:
    """Tensors the file stores in one type (`Q4_1`, `BF16`, ...) and their bytes on disk."""

    format: str
    num_tensors: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class HeldGroup:
    """`num` weights of one part held one way; `dequantized` says why a quantized one is held in floats."""

    part: str
    held: str
    num: int
    dequantized: str | None = None


@dataclass(frozen=True, slots=True)
class BackendReport:
    """How one backend holds the whole model's weights (`note`: why it cannot say, if it cannot)."""

    backend: str
    dtype: str
    groups: list[HeldGroup] = field(default_factory=list)
    note: str | None = None


@dataclass(frozen=True, slots=True)
class StageBytes:
    """Weight bytes of a torch stage holding layers [start, end): its layers, and the embedding
    and head it holds (`ends`, once where a tied stage shares them)."""

    start: int
    end: int
    layers: int
    ends: int

    @property
    def total(self) -> int:
        return self.layers + self.ends


@dataclass(frozen=True, slots=True)
class StageMemory:
    backend: str
    dtype: str
    stages: list[StageBytes]


@dataclass(frozen=True, slots=True)
class ModelReport:
    path: str
    file_format: str
    file_bytes: int
    model_id: str
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    weights: str
    stage_layers: int
    stored: list[StoredType]
    backends: list[BackendReport]
    memory: list[StageMemory]


def inspect_model(
    source: ModelSource, *, weights: str = "native", stage_layers: int | None = None
) -> ModelReport:
    """Everything `mohawk model inspect` prints, from the file's config and index alone.

    Raises ModelLoadError for a file whose tensors are missing or misshapen, ConfigError for an
    unknown weight mode."""
    weights_dtype(weights, "auto")  # checks the weight mode
    source.check_tensors()
    config = source.config
    count = config.num_layers if stage_layers is None else stage_layers
    if not 1 <= count <= config.num_layers:
        raise ModelLoadError(f"--layers {count}: {config.model_id} has 1 to {config.num_layers} layers")
    file_format, file_bytes, stored = stored_types(source)
    return ModelReport(
        path=str(source.path),
        file_format=file_format,
        file_bytes=file_bytes,
        model_id=config.model_id,
        architecture=config.architecture,
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        tie_word_embeddings=config.tie_word_embeddings,
        weights=weights,
        stage_layers=count,
        stored=stored,
        backends=[*(torch_report(source, weights, d) for d in TORCH_DEVICES), mlx_report(source, weights)],
        memory=[stage_memory(source, weights, d, count) for d in TORCH_DEVICES],
    )


def stored_types(source: ModelSource) -> tuple[str, int, list[StoredType]]:
    """The file's format, its bytes, and its tensors grouped by stored type (largest first)."""
    if isinstance(source, GGUFSource):
        index = GGUFFile(source.path)
        for info in index.tensors.values():
            if info.tensor_type.name not in DECODABLE_FORMATS and not can_dequantize(info.tensor_type):
                raise ModelLoadError(
                    f"{source.path}: tensor {info.name} is stored as {info.tensor_type.name}, which "
                    "neither Mohawk nor the gguf package can decode"
                )
        tensors = [(info.tensor_type.name, info.nbytes) for info in index.tensors.values()]
        file_format, file_bytes = "GGUF", source.path.stat().st_size
    elif isinstance(source, SafetensorsSource):
        files = weight_files(source.path)
        tensors = [(e.dtype, e.nbytes) for file in files for e in read_header(file).values()]
        file_format, file_bytes = "safetensors", sum(file.stat().st_size for file in files)
    else:
        raise ModelLoadError(f"{source.path} is neither a GGUF file nor a safetensors directory")
    counts, sizes = Counter[str](), Counter[str]()
    for name, nbytes in tensors:
        counts[name] += 1
        sizes[name] += nbytes
    stored = [StoredType(name, counts[name], sizes[name]) for name in counts]
    return file_format, file_bytes, sorted(stored, key=lambda s: (-s.num_bytes, s.format))


def torch_report(source: ModelSource, weights: str, device: str) -> BackendReport:
    """How a torch stage on `device` (cpu, cuda) holds each weight under weight mode `weights`."""
    dtype = compute_dtype("auto", device, weights)
    groups: Counter[tuple[str, str, str | None]] = Counter()
    for layer in range(source.config.num_layers):
        for path, held in layer_matmul_formats(source, layer, weights).items():
            part = MOE_PART if path.startswith("mlp.experts.") else LAYER_MATMULS_PART
            groups[(part, _matmul_label(held, dtype), _dequantized(held, weights))] += 1
    for name in _other_names(source):
        groups[(NORMS_PART, dtype, _float_reason(source.stored_format(name), weights, "norm"))] += 1
    for name in _router_names(source):
        groups[(MOE_PART, dtype, _float_reason(source.stored_format(name), weights, "router"))] += 1
    groups[("embedding", *_embedding_label(source, weights, dtype))] += 1
    head = matmul_format(source, [LM_HEAD], weights, is_head=True)
    label = _matmul_label(head, dtype)
    if head_is_split(source, weights, device):
        label += " + exact Q8_0 rows, one table split into nibbles (SplitQ8Head)"
    elif head_is_rescored(source, weights):
        label += " + exact Q8_0 rows to rescore its shortlist (RescoredHead)"
    part = "lm head (tied)" if source.config.tie_word_embeddings else "lm head"
    groups[(part, label, _dequantized(head, weights))] += 1
    return BackendReport(f"torch {device}", dtype, _held_groups(groups))


def mlx_report(source: ModelSource, weights: str) -> BackendReport:
    """How an MLX stage holds each weight (`mlx_quant.held_bits`); a note where MLX is absent."""
    resolved = weights_dtype(weights, "auto")
    dtype = "float32" if resolved == "auto" else resolved
    mlx_quant = _mlx_quant()
    if mlx_quant is None:
        return BackendReport("mlx", dtype, note="MLX is not installed here, so its choices are not shown")
    config = source.config
    groups: Counter[tuple[str, str, str | None]] = Counter()
    names = [EMBEDDING, *(n for layer in range(config.num_layers) for n in layer_names(config, layer))]
    names += [FINAL_NORM] + ([] if config.tie_word_embeddings else [LM_HEAD])  # a tied head is the table
    for name in names:
        stored = source.stored_format(name)
        bits, reason = mlx_quant.held_bits(name, stored, expected_shape(config, name)[-1], weights)
        held = dtype if bits is None else f"{bits}-bit from {stored}"
        groups[(_mlx_part(name, config.tie_word_embeddings), held, reason)] += 1
    return BackendReport("mlx", dtype, _held_groups(groups))


def stage_memory(source: ModelSource, weights: str, device: str, count: int) -> StageMemory:
    """Weight bytes of the first, a middle and the last stage of `count` layers on a torch `device`
    (one stage when `count` is every layer)."""
    num_layers = source.config.num_layers
    dtype = compute_dtype("auto", device, weights)
    ends = stage_weight_bytes(source, weights, dtype, device)
    ranges = [(0, count)]
    if count < num_layers:
        ranges += [(count, 2 * count)] if 3 * count <= num_layers else []
        ranges += [(num_layers - count, num_layers)]
    stages = [
        StageBytes(
            start,
            end,
            layers=sum(
                layer_weight_bytes(source, layer, weights, dtype, device) for layer in range(start, end)
            ),
            ends=ends.held(embedding=start == 0, head=end == num_layers),
        )
        for start, end in ranges
    ]
    return StageMemory(f"torch {device}", dtype, stages)


def layer_weight_bytes(source: ModelSource, layer: int, weights: str, dtype: str, device: str = "cpu") -> int:
    """Bytes a torch stage on `device` holds for decoder layer `layer`: what a node measures on its
    one-layer stage and reports as `layer_weight_bytes`."""
    config = source.config
    element = ELEMENT_BYTES.get(dtype, 4)
    total, fused = 0, set()
    parts = layer_matmuls(config, layer)
    for path, held in layer_matmul_formats(source, layer, weights).items():
        names = [f"layers.{layer}.{part}.weight" for part in parts[path]]
        fused.update(names)
        part_rows = [expected_shape(config, name)[0] for name in names]
        total += matmul_bytes(
            held, part_rows, expected_shape(config, names[0])[1], element, device.split(":")[0]
        )
    rest = [name for name in layer_names(config, layer) if name not in fused]
    return total + sum(math.prod(expected_shape(config, name)) * element for name in rest)


def _held_groups(groups: Counter[tuple[str, str, str | None]]) -> list[HeldGroup]:
    return [HeldGroup(part, held, num, reason) for (part, held, reason), num in groups.items()]


def _matmul_label(held: MatmulFormat, dtype: str) -> str:
    return dtype if held.held == DENSE else held.label


def _dequantized(held: MatmulFormat, weights: str) -> str | None:
    """Why a matmul stored quantized is held in floats, or None when it is not."""
    if held.held != DENSE or all(f in FLOAT_FORMATS for f in held.stored):
        return None
    if held.fallback is None:
        return f"--weights {weights} holds every matmul dense"
    return _LAYER_PREFIX.sub("", held.fallback)  # the same reason in every layer: one line


def _embedding_label(source: ModelSource, weights: str, dtype: str) -> tuple[str, str | None]:
    stored = source.stored_format(EMBEDDING)
    table = embedding_format(source, weights)
    if table is None:
        return dtype, _float_reason(stored, weights, "token table")
    minimums = " with minimums" if table.has_mins else ""
    origin = f"the file's {stored} codes" if table.from_file else f"re-grouped from {stored} at load"
    return f"{table.bits}-bit groupwise{minimums}, {origin}", None


def _float_reason(stored: str, weights: str, what: str) -> str | None:
    if stored in FLOAT_FORMATS:
        return None
    if weights not in ("native", "int4"):
        return f"--weights {weights} holds every {what} dense"
    if what == "token table":
        return f"no groupwise table for {stored} (only {', '.join(sorted(GROUPWISE_TABLES))})"
    return f"no kernel for a {stored} {what}"


def _other_names(source: ModelSource) -> list[str]:
    """Layer tensors that are neither a matmul weight nor a MoE router (norms, biases), and the
    final norm."""
    config = source.config
    names = []
    for layer in range(config.num_layers):
        matmuls = {
            f"layers.{layer}.{p}.weight" for parts in layer_matmuls(config, layer).values() for p in parts
        }
        names += [n for n in layer_names(config, layer) if n not in matmuls]
    routers = set(_router_names(source))
    return [n for n in names if n not in routers] + [FINAL_NORM]


def _router_names(source: ModelSource) -> list[str]:
    """Every MoE layer's router."""
    config = source.config
    return [
        f"layers.{layer}.mlp.gate.weight" for layer in range(config.num_layers) if config.is_moe_layer(layer)
    ]


def _mlx_part(name: str, tied: bool) -> str:
    if name == EMBEDDING:
        return "embedding + lm head (tied)" if tied else "embedding"
    if name == LM_HEAD:
        return "lm head"
    return "layer matmul weights" if name.endswith("_proj.weight") else NORMS_PART


def _mlx_quant() -> ModuleType | None:
    try:
        from mohawk_shard.backends import mlx_quant
    except ImportError:
        return None
    return mlx_quant
