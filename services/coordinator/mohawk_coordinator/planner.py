"""Placement planner: which node holds which contiguous layer range.

Design. A pipeline's steady throughput is set by its slowest stage, so the planner minimises the
bottleneck `max(num_layers(stage) × seconds_per_layer(node))` over every way of cutting layers
[0, L) into contiguous ranges across the nodes, taken in a fixed order (sorted by node id) where
a node may also hold nothing. Each stage must fit its node's memory: its layers' weights plus
their share of the KV budget, plus the embedding on the first stage and the LM head on the last.
This is a dynamic programme over (node, layers placed so far), O(N·L²). Ties go to fewer stages
(fewer hops), then to the earlier node order, so the same inputs always give the same plan.
Two policies decide what happens when nodes could hold more than they must. `pack` (fewest
hops): when one node can hold the whole model, the plan is that node alone (the fastest such node),
since splitting a model that fits buys no speed at batch 1 and pays every hop; otherwise the DP
above, where a node may be left out. `spread` (as exo does): every node takes a share, so the DP
must give each node at least one layer, which spreads memory and KV pressure over the cluster
and puts every node to work; nodes that cannot hold even one layer are left out, and when there
are more nodes than layers the `pack` split is used. A node provisioned with a slice package
(no model on its disk) can hold only layers inside its slice: the DP never gives it others, and
such nodes take their place in the order by their slice's first layer. Every plan carries the
reasons it was chosen, for `mohawk plan --explain`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mohawk_common.errors import MohawkError

Placement = Literal["pack", "spread"]
PLACEMENTS: tuple[Placement, ...] = ("pack", "spread")


class PlanningError(MohawkError):
    """No placement satisfies the nodes' memory limits."""


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """Bytes a stage needs: per decoder layer (weights + KV budget), embedding, LM head."""

    model_id: str
    num_layers: int
    layer_bytes: int
    embedding_bytes: int
    head_bytes: int

    def stage_bytes(self, start: int, end: int) -> int:
        extra = (self.embedding_bytes if start == 0 else 0) + (
            self.head_bytes if end == self.num_layers else 0
        )
        return (end - start) * self.layer_bytes + extra


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What a node reported in its heartbeat that placement needs."""

    node_id: str
    memory_bytes: int
    seconds_per_layer: float
    backend: str = "torch"
    device: str = "cpu"
    held: tuple[int, int] | None = None  # a node provisioned with one slice can serve only [start, end)

    def can_hold(self, start: int, end: int) -> bool:
        return self.held is None or (self.held[0] <= start and end <= self.held[1])


@dataclass(frozen=True, slots=True)
class StagePlacement:
    node_id: str
    start: int
    end: int
    memory_bytes: int
    seconds_per_token: float

    @property
    def num_layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Plan:
    model_id: str
    stages: tuple[StagePlacement, ...]
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def bottleneck_seconds(self) -> float:
        return max(s.seconds_per_token for s in self.stages)

    def explain(self) -> str:
        """A table of the stages and the reasons behind them, for operators."""
        lines = [f"plan for {self.model_id}: {len(self.stages)} stage(s)"]
        lines.append(f"{'stage':>5}  {'node':<16} {'layers':<10} {'memory MiB':>10} {'ms/token':>9}")
        for index, s in enumerate(self.stages):
            layers = f"[{s.start}, {s.end})"
            mib = s.memory_bytes / 2**20
            lines.append(
                f"{index:>5}  {s.node_id:<16} {layers:<10} {mib:>10.1f} {s.seconds_per_token * 1e3:>9.2f}"
            )
        lines.extend(f"- {reason}" for reason in self.reasons)
        return "\n".join(lines)


_Best = tuple[float, int, tuple[StagePlacement, ...]]  # (bottleneck, number of stages, stages)


def plan_placement(model: ModelFootprint, nodes: Sequence[NodeCapacity], policy: Placement = "pack") -> Plan:
    """The placement with the smallest bottleneck that fits every node's memory (see module doc)."""
    if not nodes:
        raise PlanningError(f"no nodes to place {model.model_id} on")
    if policy not in PLACEMENTS:
        raise PlanningError(f"unknown placement policy {policy!r} (known: {', '.join(PLACEMENTS)})")
    # nodes holding a fixed slice sit in the pipeline where their layers are
    ordered = sorted(nodes, key=lambda n: (n.held[0] if n.held is not None else 0, n.node_id))
    if policy == "pack":
        return _pack(model, ordered)
    spread = _spread(model, ordered)
    if spread is not None:
        return spread
    packed = _pack(model, ordered)
    fallback = "placement policy spread: not every node can take a share of the layers, so the fewest hops"
    return Plan(packed.model_id, packed.stages, (fallback, *packed.reasons))


def _pack(model: ModelFootprint, ordered: Sequence[NodeCapacity]) -> Plan:
    whole = model.stage_bytes(0, model.num_layers)
    single = [n for n in ordered if n.memory_bytes >= whole and n.can_hold(0, model.num_layers)]
    if single:
        node = min(single, key=lambda n: (n.seconds_per_layer, n.node_id))
        stage = stage_placement(model, node, 0, model.num_layers)
        reason = (
            f"{node.node_id} holds the whole model ({whole / 2**20:.1f} MiB of "
            f"{node.memory_bytes / 2**20:.1f} MiB) and is the fastest node that can "
            f"({node.seconds_per_layer * 1e3:.3f} ms/layer): one stage, no hops"
        )
        return Plan(model.model_id, (stage,), (reason,))
    best = _split(model, ordered, every_node=False)
    if best is None:
        total = sum(n.memory_bytes for n in ordered)
        raise PlanningError(
            f"{model.model_id} needs {whole / 2**20:.1f} MiB split into contiguous ranges, and the "
            f"{len(ordered)} node(s) ({total / 2**20:.1f} MiB in all) cannot hold it"
        )
    reasons = (f"no single node holds the whole model ({whole / 2**20:.1f} MiB)", _split_reason(best[2]))
    return Plan(model.model_id, best[2], reasons)


def _spread(model: ModelFootprint, ordered: Sequence[NodeCapacity]) -> Plan | None:
    """Every node that can hold a layer takes a share; None when that is impossible."""
    able = [n for n in ordered if _fits_one_layer(model, n)]
    if not able or len(able) > model.num_layers:
        return None
    best = _split(model, able, every_node=True)
    if best is None:
        return None
    stages = best[2]
    reasons = [f"placement policy spread: each of the {len(stages)} node(s) takes a share of the layers"]
    left_out = [n.node_id for n in ordered if n not in able]
    if left_out:
        reasons.append(f"left out, too little memory for one layer: {', '.join(left_out)}")
    reasons.append(_split_reason(stages))
    return Plan(model.model_id, stages, tuple(reasons))


def _fits_one_layer(model: ModelFootprint, node: NodeCapacity) -> bool:
    """Whether the node can hold at least one layer in the middle of the pipeline."""
    return node.memory_bytes >= model.layer_bytes


def _split_reason(stages: tuple[StagePlacement, ...]) -> str:
    slowest = max(stages, key=lambda s: s.seconds_per_token)
    return (
        f"split across {len(stages)} node(s) to minimise the slowest stage: {slowest.node_id} at "
        f"{slowest.seconds_per_token * 1e3:.2f} ms/token; faster nodes take more layers, each within "
        "its memory"
    )


def stage_placement(model: ModelFootprint, node: NodeCapacity, start: int, end: int) -> StagePlacement:
    """Layers [start, end) on `node`: their bytes, and the seconds a token spends in them there."""
    return StagePlacement(
        node.node_id, start, end, model.stage_bytes(start, end), (end - start) * node.seconds_per_layer
    )


def _split(model: ModelFootprint, nodes: Sequence[NodeCapacity], *, every_node: bool) -> _Best | None:
    num_layers = model.num_layers
    # best[l]: the best way to place layers [0, l) on the nodes seen so far
    best: list[_Best | None] = [(0.0, 0, ())] + [None] * num_layers
    for node in nodes:
        # a node may hold nothing (keep `best`) unless every node must take a share
        nxt: list[_Best | None] = [None] * (num_layers + 1) if every_node else list(best)
        for placed in range(num_layers + 1):
            before = best[placed]
            if before is None:
                continue
            for end in range(placed + 1, num_layers + 1):
                if model.stage_bytes(placed, end) > node.memory_bytes:
                    break
                if not node.can_hold(placed, end):
                    continue
                stage = stage_placement(model, node, placed, end)
                candidate = (max(before[0], stage.seconds_per_token), before[1] + 1, (*before[2], stage))
                current = nxt[end]
                if current is None or candidate[:2] < current[:2]:
                    nxt[end] = candidate
        best = nxt
    return best[num_layers]
