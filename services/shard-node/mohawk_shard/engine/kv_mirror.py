"""A warm standby that also holds its neighbour's KV: taking a dead stage's layers over then
computes nothing of what they had computed.

Design. A failover re-plans onto the node that holds the dead stage's layers on standby (weights
loaded), and every survivor keeps its KV across the re-plan (`kv_carry`); what was left was the
dead layers' KV, so the holder computed every position of every resumed request through them:
0.60 s of the 1.7B's 0.77 s resume of 16 streams on two threads (`bench/resume_floor.py`), more
once the two survivors share the cores. With `kv_mirror` on, a stage whose layers the next
stage's node holds on standby attaches to each activation frame the KV it computed in that step
(`StepMirror`, `engine_pb2.KvMirror` on the wire): per sequence, the positions since the last it
sent, from 0 on a sequence's first step (a prefix-cache hit's KV included), and from 0 again after
mirroring is turned back on. The holder's stage keeps them per request id (`KvMirrorStore`), drops
a request's when it is freed, and a copy that skips positions (a frame lost with a dying sender)
is dropped, never used with a hole. When a re-plan stops the holder's stage, the mirror goes into
its carry as the covered layer range's KV, so the widened stage that takes the range over resumes
each request from the last position, as the survivors do. Only the next stage can hold the mirror
(the frames already go there, on the channel the two stages share); the planner prefers that
neighbour. The cost: each step's new KV of the covered layers crosses once more (an 8-layer
stage of the 1.7B shape: 64 KiB a token, 16-bit KV), and the holder keeps it in host memory.
Mirroring starts `SETTLE_S` after the plan asks (`node/standby.MirrorSwitch`), and a step sends at
most `stage.MIRROR_BACKLOG_POSITIONS` of a backlog, so the running requests' KV when it starts
crosses over several steps, not in one burst.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mohawk_shard.engine.kv_carry import CarriedPart, Range, RequestCarry


@runtime_checkable
class MirrorsKV(Protocol):
    """A backend whose KV can be copied out a step at a time and joined again (torch)."""

    def pack_kv(self, spans: Sequence[tuple[Sequence[int], int, int]]) -> Any:
        """One array [layers, 2, kv_heads, positions, head_dim] of positions [lo, hi) of each
        `(block table, lo, hi)`, laid end to end."""
        ...

    def split_kv(self, packed: Any, sizes: Sequence[int]) -> list[Any]:
        """`packed` cut along its positions into pieces of `sizes`."""
        ...

    def join_kv(self, pieces: Sequence[Any]) -> Any:
        """Pieces of one sequence, in position order, as `export_kv` gives a sequence's KV."""
        ...


@dataclass(frozen=True, slots=True)
class MirrorSpan:
    seq_id: int
    from_position: int
    num_positions: int


@dataclass(frozen=True, slots=True)
class StepMirror:
    """The KV a stage computed in one step, for the node holding its layers on standby."""

    layers: Range
    spans: tuple[MirrorSpan, ...]
    packed: Any  # `MirrorsKV.pack_kv`'s array


@dataclass(slots=True)
class _Mirrored:
    layers: Range
    pieces: list[Any] = field(default_factory=list)
    length: int = 0  # positions [0, length) are in `pieces`
    nbytes: int = 0


class KvMirrorStore:
    """The KV a neighbour mirrored here, per request id, until the request is freed; at most
    `max_bytes` in all (a request whose copy would pass it is not kept: its layers are computed
    again if they are taken over)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._requests: dict[str, _Mirrored] = {}
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.num_refused = 0  # requests not kept for want of room

    def __len__(self) -> int:
        return len(self._requests)

    def keep(self, key: str, layers: Range, from_position: int, piece: Any, num_positions: int) -> None:
        """Add positions [from_position, from_position + num_positions) of request `key`: from 0 it
        starts again; past what is held, the copy has a hole and is dropped."""
        if not key:
            return
        held = self._requests.get(key)
        if from_position == 0 or held is None or held.layers != layers:
            self.drop(key)
            if from_position != 0:
                return
            held = self._requests[key] = _Mirrored(layers)
        size = int(getattr(piece, "nbytes", 0))
        if from_position != held.length:
            self.drop(key)
            return
        if self.max_bytes is not None and self.nbytes + size > self.max_bytes:
            self.drop(key)
            self.num_refused += 1
            return
        held.pieces.append(piece)
        held.length += num_positions
        held.nbytes += size
        self.nbytes += size

    def drop(self, key: str) -> None:
        gone = self._requests.pop(key, None)
        if gone is not None:
            self.nbytes -= gone.nbytes

    def carried(self, backend: MirrorsKV) -> dict[str, RequestCarry]:
        """Each request's mirrored KV, as the carry of its layer range."""
        return {
            key: {held.layers: CarriedPart(backend.join_kv(held.pieces), held.length)}
            for key, held in self._requests.items()
            if held.length > 0
        }
