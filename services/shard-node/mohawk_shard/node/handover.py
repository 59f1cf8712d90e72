"""Make before break: a node loads its next stage while it still serves the one it has.

Design. When a new plan moves a node to another stage (a node joined or left, and the layers were
dealt again), the node does not stop serving. It loads the new range's weights and KV pool beside
the running stage, on a second thread (`prepare`), and then reports the new plan version loaded.
A stage 1+ node starts its new worker at once (a subscription on the new pipeline's subjects, so
no frame of the new pipeline is missed); a new stage 0 is built but pulls nothing yet. Meanwhile
the old pipeline (its own epoch, its own subjects) keeps pulling and serving requests from the
durable stream. When every stage of the new pipeline has reported loaded the coordinator marks it
active; each node then stops its old role (an old stage 0 hands its unfinished requests back to
the stream, where the new stage 0 resumes them from their emitted tokens) and the new stage 0
starts pulling. The pause a client sees is that switch, not the load.

Memory decides: both stages are held at once only when the node has room for the new one beside
the old (`room_for_both`: within the node's memory limit and what the host has free). Otherwise it
breaks first, as before: the old stage stops and its memory is freed before the new one loads,
and requests wait, durable, in the stream meanwhile. A node that keeps its layer range shares the
weights with its new stage (`share_weights`: a shallow copy of the backend with a KV pool of its
own), so only the KV pool is held twice. An MLX node loads on its compute thread (MLX arrays
belong to the thread's stream), so it pauses serving during the load but still refuses nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from mohawk_shard.engine.backend import Backend
from mohawk_shard.node.capacity import Capacity
from mohawk_shard.node.pipeline_view import PipelineView

FREE_MEMORY_SHARE = 0.9  # of the host's available memory a second stage may take


@dataclass(frozen=True, slots=True)
class StageFootprint:
    weight_bytes: int
    kv_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes


def stage_footprint(
    capacity: Capacity, view: PipelineView, index: int, *, shared_weights: bool = False
) -> StageFootprint:
    """What stage `index` of `view` takes on this node: its weights (none when shared with the
    stage it serves now) and its KV pool, from the node's own measured bytes."""
    placement = view.stages[index]
    num_layers = placement.end - placement.start
    weights = 0
    if not shared_weights:
        weights = num_layers * capacity.layer_weight_bytes
        if placement.start == 0:
            weights += capacity.embedding_weight_bytes
        if placement.end == view.num_layers:
            weights += capacity.head_weight_bytes
    kv = (
        view.num_kv_blocks
        * capacity.kv_block_bytes_per_layer
        * capacity.page_layers(placement.start, placement.end)
    )
    return StageFootprint(weights, kv)


def serving_footprint(capacity: Capacity, backend: Backend, view: PipelineView) -> StageFootprint:
    """What the stage the node serves now holds: its backend's weights and its KV pool."""
    kv_layers = capacity.page_layers(backend.start, backend.end)
    return StageFootprint(
        backend.weight_bytes, view.num_kv_blocks * capacity.kv_block_bytes_per_layer * kv_layers
    )


def room_for_both(capacity: Capacity, serving: StageFootprint, upcoming: StageFootprint) -> bool:
    """Whether the node can hold `upcoming` beside `serving`: within its memory limit, and within
    what the host (or device) has free now."""
    within_limit = serving.total + upcoming.total <= capacity.memory_limit_bytes
    return within_limit and upcoming.total <= FREE_MEMORY_SHARE * capacity.free_memory_bytes()


def share_weights(backend: Backend) -> Backend:
    """A backend over the same weights as `backend`, for a stage of the same layer range; give it
    its own KV pool (`allocate_kv_cache`) before use, which leaves `backend`'s pool untouched."""
    return copy.copy(backend)
