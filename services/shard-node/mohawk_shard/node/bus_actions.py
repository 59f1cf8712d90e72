"""What stage 0's request table asks of the bus, as values, and the thin layer that does it.

Design. The table (`request_table.py`) decides and never awaits NATS: each of its operations
returns the messages to settle and the error events to send, as `Action`s, and `BusActions`
carries them out in order. A request's message leaves the work queue one of four ways: acked (it
finished, was cancelled, or nobody waits for it), naked (handed back for the next stage 0, or
retried a moment later), terminated (it can never be served), or ended with an error event first
(`Fail`: the gateway answers its client with it, then the message is terminated; `Late`: a 504
event, then acked). One action failing on the bus (NATS away for a moment) is logged and the rest
still go: the stream redelivers what was not settled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from nats.aio.client import Client

from mohawk_shard.node.tokens import publish_error

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from mohawk_pqc.seal import EventBox


@dataclass(frozen=True, slots=True)
class Ack:
    msg: Msg


@dataclass(frozen=True, slots=True)
class Nak:
    msg: Msg
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class Term:
    msg: Msg


@dataclass(frozen=True, slots=True)
class Fail:
    """An error event its gateway answers with, then the message terminated."""

    msg: Msg
    request_id: str
    reason: str
    status: int
    box: EventBox | None


@dataclass(frozen=True, slots=True)
class Late:
    """Its deadline passed: a 504 error event, then the message acked."""

    msg: Msg
    request_id: str
    box: EventBox | None


Action = Ack | Nak | Term | Fail | Late


class BusActions:
    def __init__(self, nc: Client, log: structlog.typing.FilteringBoundLogger) -> None:
        self.nc, self._log = nc, log
        self._background: set[asyncio.Task[None]] = set()

    async def carry_out(self, actions: list[Action]) -> None:
        """Each action in turn; one that fails is logged and the others still go."""
        for action in actions:
            try:
                await self._one(action)
            except Exception as exc:
                self._log.warning("a bus action failed", action=type(action).__name__, error=repr(exc))

    def start(self, actions: list[Action]) -> None:
        """Carry `actions` out in the background (a step's acks must not hold up the next step)."""
        if not actions:
            return
        task = asyncio.create_task(self.carry_out(actions))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _one(self, action: Action) -> None:
        match action:
            case Ack(msg):
                await msg.ack()
            case Nak(msg, delay):
                await msg.nak(delay=delay)
            case Term(msg):
                await msg.term()
            case Fail(msg, request_id, reason, status, box):  # the one place stage 0 does both
                await publish_error(self.nc, request_id, reason, status, box)
                await msg.term()
            case Late(msg, request_id, box):
                await publish_error(self.nc, request_id, "the request's deadline passed", 504, box)
                await msg.ack()
