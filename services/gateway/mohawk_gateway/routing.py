"""Which pipeline a request goes to, when the plan has several (replicas).

Design. `least-queue` (the default) routes nothing: the request goes on the model's shared
subject, and every pipeline's stage 0 pulls from it only while it has room, so the request lands
on whichever pipeline frees a slot first. `round-robin` and `prefix-affinity` pick one of the
plan's active pipelines and publish on that pipeline's own subject (`mohawk.v1.req.<model>.p<id>`),
which its stage 0 pulls before the shared one. Round robin takes the active pipelines in turn.
Prefix affinity sends every turn of a conversation to the same pipeline, so the KV blocks of the
turns before stay in that pipeline's prefix cache: the key is the conversation's opening (the
system messages and the first user message), which every later turn repeats, hashed with each
pipeline id, and the highest hash wins (rendezvous hashing: when a pipeline comes or goes, only
the conversations that were or will be on it move). A raw completion's key is its first
`AFFINITY_TOKENS` prompt tokens. A session (the sessions API) may ask for affinity whatever the
gateway's routing: its turns are then routed by prefix affinity on the session's id. Requests
routed to a pipeline that then leaves the plan are not stranded: the stage 0 of the lowest active
pipeline drains routes no active pipeline serves.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from typing import Any, Literal

from mohawk_common.bus.pipelines import pipelines
from mohawk_proto.v1 import bus_pb2

Routing = Literal["least-queue", "round-robin", "prefix-affinity"]
ROUTINGS: tuple[Routing, ...] = ("least-queue", "round-robin", "prefix-affinity")
AFFINITY_TOKENS = 256


class Router:
    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        self._turns = itertools.count()

    def route(self, plan: bus_pb2.Plan | None, affinity_key: bytes, *, sticky: bool = False) -> int | None:
        """The pipeline id to publish to, or None for the shared subject (least queue; no pipeline
        active yet, so the request waits for whichever comes first; or only one, so there is nothing
        to choose). `sticky` routes by prefix affinity whatever the gateway's routing."""
        routing: Routing = "prefix-affinity" if sticky else self.routing
        if routing == "least-queue" or plan is None:
            return None
        active = [p.id for p in pipelines(plan) if p.active]
        if len(active) < 2:  # none, or the one every stage 0 pulls from the shared subject anyway
            return None
        if routing == "round-robin":
            return active[next(self._turns) % len(active)]
        return max(active, key=lambda pipeline_id: _score(affinity_key, pipeline_id))


def _score(key: bytes, pipeline_id: int) -> bytes:
    return hashlib.blake2b(key + pipeline_id.to_bytes(4, "little"), digest_size=8).digest()


def chat_affinity_key(messages: Sequence[dict[str, Any]]) -> bytes:
    """A conversation's opening: its system messages and first user message, as every turn repeats them."""
    opening = []
    for message in messages:
        opening.append(message)
        if message.get("role") == "user":
            break
    return json.dumps(opening, sort_keys=True, default=str).encode()


def prompt_affinity_key(prompt_token_ids: Sequence[int]) -> bytes:
    """A raw prompt's key: its first AFFINITY_TOKENS token ids."""
    return b"".join(t.to_bytes(4, "little") for t in prompt_token_ids[:AFFINITY_TOKENS])
