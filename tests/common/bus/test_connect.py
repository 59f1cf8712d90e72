"""`server_has_all` against a real nats-server: once it returns, the server holds the connection's
subscriptions, so another connection's request is answered (nats-py's own `flush()` sends its PING
ahead of the buffered SUB, and such a request could meet "no responders")."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.server import NatsServer

ROUNDS = 60


def test_a_subscription_is_on_the_server_when_server_has_all_returns(nats_server: NatsServer) -> None:
    async def scenario() -> int:
        asker = await connect([nats_server.url], name="asker", attempts=3)
        answerer = await connect([nats_server.url], name="answerer", attempts=3)
        answered = 0

        async def answer(msg: Msg) -> None:
            await msg.respond(b"here")

        try:
            for n in range(ROUNDS):
                sub = await answerer.subscribe(f"test.barrier.{n}", cb=answer)
                await server_has_all(answerer)
                reply = await asker.request(f"test.barrier.{n}", b"", timeout=5)  # NoRespondersError if not
                answered += reply.data == b"here"
                await sub.unsubscribe()
        finally:
            await asker.close()
            await answerer.close()
        return answered

    assert asyncio.run(scenario()) == ROUNDS
