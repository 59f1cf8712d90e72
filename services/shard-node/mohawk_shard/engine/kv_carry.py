"""The KV a stage keeps across a re-plan, and the step that uses it: a failover recomputes only the
layers whose KV died with their node.

Design. When a plan changes, every unfinished request goes back to the stream and is resumed by the
new pipeline from the tokens its client has seen: a prefill of prompt and output so far. Before
this module every stage recomputed all of it, so a dead third cost the whole model's prefill of
every stream (1.92 s for 16 streams of the 1.7B on two threads, `bench/resume_floor.py`;
0.77 s with the survivors' KV carried). Now a stage
stopped by a re-plan hands its successor on the same node what it holds of each request (`Carry`),
per layer range it ran (`CarriedPart`): the KV of the positions it computed, and, where the range
ended the stage and was not the last, the hidden rows it sent on. The successor, for each range
whose layers it runs again, keeps from a resumed request's prefill only the positions its carried
KV lacks: those it had are copied into the blocks the new stage 0 gives them, and the rows the
next range (or stage) needs of them come from the carried outputs. A range with nothing carried —
the dead node's layers, taken up by a standby or a survivor — computes every position from the
rows it is sent. Every stage still sends the next every row of a chunk, so stages never agree on
anything: each trims by what it holds itself, and a stage without a carry computes as before.

What a carry may be trusted for. A carried position holds the KV of the token the request had
there, and a request's tokens up to what its client has seen never change; so the carry is used up
to the resumed history's length less one (its last position is always computed: the last stage
samples from it, and tokens past what was published may have been sampled and then lost). Keys are
request ids. The rows a range needs come from its successor backwards (`compute_starts`): a range
computes from the first position it lacks KV for, unless the rows the next one needs below that
point were not kept, in which case it computes from there (its KV for those positions is written
again, with the same bits: the default is batch invariant). A carry no request claims within
`CARRY_TTL_S` is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mohawk_shard.model.forward_batch import ForwardBatch

CARRY_TTL_S = 120.0  # a carried request not resumed within this is dropped (its client gave up)

Range = tuple[int, int]  # a layer range [start, end)


@runtime_checkable
class CarriesKV(Protocol):
    """A backend that can copy a sequence's KV out and back in (torch; MLX computes again)."""

    start: int
    end: int
    has_head: bool

    @property
    def carries_kv(self) -> bool:
        """Whether this backend's KV can be carried now (one full-attention group, no int8 tier)."""
        ...

    def export_kv(self, table: Sequence[int], length: int) -> Any:
        """A copy of the KV of positions [0, length) of the sequence whose blocks are `table`."""
        ...

    def import_kv(self, kv: Any, table: Sequence[int], lo: int, hi: int) -> None:
        """Write positions [lo, hi) of `kv` (`export_kv`'s) into the slots `table` gives them."""
        ...

    def forward(self, batch: ForwardBatch, hidden: Any | None) -> Any: ...

    def slots(self, table: Sequence[int], lo: int, hi: int) -> Any:
        """The KV slots of positions [lo, hi) of the sequence whose blocks are `table`."""
        ...

    def row_pool(self, num_slots: int, like: Any) -> Any:
        """Room for one row like `like`'s per KV slot (a stage's rows sent on)."""
        ...

    def write_rows(self, pool: Any, slots: Any, rows: Any) -> None:
        """Put `rows` at `slots` (an array of slot ids, numpy or `slots`')."""
        ...

    def read_rows(self, pool: Any, slots: Any) -> Any:
        """A copy of the rows at `slots`."""
        ...

    def join_rows(self, rows: Sequence[Any]) -> Any:
        """Hidden rows of several sequences as one array, in order."""
        ...


@runtime_checkable
class HasParts(Protocol):
    """A backend run as consecutive layer ranges (`StackedBackend`)."""

    parts: tuple[Any, ...]


def leaf_parts(backend: Any) -> tuple[Any, ...]:
    """The backends `backend` runs, one per layer range, in order (a stack may hold a stack)."""
    if isinstance(backend, HasParts):
        return tuple(leaf for part in backend.parts for leaf in leaf_parts(part))
    return (backend,)


def carrier_parts(backend: Any) -> tuple[CarriesKV, ...] | None:
    """`backend`'s layer ranges, if every one can carry its KV now; else None."""
    parts = leaf_parts(backend)
    if all(isinstance(part, CarriesKV) and part.carries_kv for part in parts):
        return parts
    return None


@dataclass(frozen=True, slots=True)
class CarriedPart:
    """One layer range's KV of one request, and the rows it output, from the stage before a re-plan."""

    kv: Any
    length: int  # positions [0, length) are in `kv`
    outputs: Any | None = None  # rows after the range's last layer (None: not kept), of positions
    num_outputs: int = 0  # [outputs_from, outputs_from + num_outputs): a prefix-cache hit's are not
    outputs_from: int = 0  # the sequence's own

    @property
    def outputs_end(self) -> int:
        return self.outputs_from + self.num_outputs if self.outputs is not None else 0


RequestCarry = dict[Range, CarriedPart]


@dataclass(slots=True)
class Carry:
    """What a stopped stage hands its successor: request id → its carried layer ranges."""

    requests: dict[str, RequestCarry] = field(default_factory=dict)
    expires_at: float = field(default_factory=lambda: time.monotonic() + CARRY_TTL_S)

    def __len__(self) -> int:
        return len(self.requests)

    def merge(self, other: Carry) -> None:
        """Add `other`'s requests (a newer carry wins) and live as long as the newer."""
        self.requests.update(other.requests)
        self.expires_at = max(self.expires_at, other.expires_at)

    def expire(self) -> None:
        """Drop every request not claimed in time (their clients gave up, or another pipeline took them)."""
        if self.requests and time.monotonic() > self.expires_at:
            self.requests.clear()

    def claim(self, key: str, history_len: int) -> RequestCarry | None:
        """The carry of request `key`, resumed with `history_len` tokens, trimmed to what may be
        trusted (its last position is always computed again); None if none is held or it expired."""
        self.expire()
        found = self.requests.pop(key, None) if key else None
        if not found or history_len < 2:
            return None
        usable = history_len - 1
        return {r: _trimmed(part, usable) for r, part in found.items() if part.length > 0}


def _trimmed(part: CarriedPart, usable: int) -> CarriedPart:
    if part.length <= usable:
        return part
    num_outputs = max(0, min(part.num_outputs, usable - part.outputs_from))
    return CarriedPart(part.kv, usable, part.outputs, num_outputs, part.outputs_from)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One sequence's chunk [start, end) in one step, and the position each range computes from."""

    start: int
    end: int
    sample: bool
    starts: tuple[int, ...]  # per range: positions [starts[p], end) are computed, the rest carried


def compute_starts(
    held: Sequence[tuple[int, int, int]], start: int, end: int, first_needed: int
) -> tuple[int, ...]:
    """Per layer range, the first position of chunk [start, end) it must compute.

    `held[p]`: range p's carried KV length and the positions [lo, hi) of its kept output rows;
    `first_needed`: the first row the stage must output (`start` for a stage that sends rows on,
    the sampled row or `end` for the last). Walks back from the stage's output: a range computes
    from the first position it has no KV for, or lower, where the rows needed of it below that were
    not kept; the rows it computes from are what the range before must give it."""
    starts = [0] * len(held)
    needed = first_needed
    for p in range(len(held) - 1, -1, -1):
        length, kept_lo, kept_hi = held[p]
        if needed >= length:
            first = length
        elif kept_lo <= needed:
            first = min(length, max(kept_hi, needed))
        else:
            first = needed
        starts[p] = min(max(start, first), end)
        needed = starts[p]
    return tuple(starts)


def plan_chunk(carry: RequestCarry | None, ranges: Sequence[Range], step: Any, last_stage: bool) -> ChunkPlan:
    """`compute_starts` for one sequence's `SequenceStep` on a stage of `ranges`."""
    start, end = step.start_position, step.start_position + step.num_new_tokens
    held = [_held(carry, r) for r in ranges]
    first_needed = (end - 1 if step.sample else end) if last_stage else start
    return ChunkPlan(start, end, step.sample, compute_starts(held, start, end, first_needed))


def _held(carry: RequestCarry | None, layers: Range) -> tuple[int, int, int]:
    part = carry.get(layers) if carry else None
    if part is None:
        return 0, 0, 0
    return part.length, part.outputs_from, part.outputs_end


def carry_exhausted(carry: RequestCarry, length: int) -> bool:
    """Whether a sequence whose KV here covers `length` positions needs nothing more of `carry`."""
    return all(part.length <= length for part in carry.values())


def row_spans(sizes: Sequence[int]) -> Iterator[tuple[int, int]]:
    """[lo, hi) of each sequence's rows in arrays laid end to end."""
    lo = 0
    for size in sizes:
        yield lo, lo + size
        lo += size
