"""One turn of a session: the server-side history plus the new input, run like a chat completion.

Design. A turn takes the session's turn lock (one turn at a time, so the history stays a single
line), renders system prompt + history + input with the model's chat template, and submits it as
an ordinary generation carrying the session's QoS (priority, latency budget, capped max_tokens)
and, with the `affinity` hint, routed by prefix affinity on the session id, so every turn reaches
the pipeline whose prefix cache holds the turns before (the answer's
`usage.prompt_tokens_details.cached_tokens` counts the hit). When the generation ends well, the
input and the answer join the history and the turn's samples (time to first token, gaps between
tokens, duration, stage-0 batch sizes) join the session's statistics; a turn that failed or was
cancelled leaves the session as it was. `close` does both and releases the lock, exactly once.
Asynchronous turns run the same way in a task this gateway keeps, and write a record to poll.
"""

from __future__ import annotations

import asyncio
import itertools
from contextlib import suppress
from dataclasses import dataclass

import structlog

from mohawk_common.tasks import cancel_and_wait
from mohawk_common.tenancy import Tenant
from mohawk_gateway.errors import GatewayError, invalid
from mohawk_gateway.generation import Generation
from mohawk_gateway.render.chat import ChatRenderer, chat_renderer
from mohawk_gateway.render.common import new_request_id, now
from mohawk_gateway.sampling import build_sampling
from mohawk_gateway.schemas.sessions import SessionInfer
from mohawk_gateway.sessions.state import RequestRecord, SessionState, TurnSamples
from mohawk_gateway.sessions.store import SessionStore
from mohawk_gateway.shared_state import Gateway
from mohawk_gateway.submission import Submission

log = structlog.get_logger("mohawk.gateway")


@dataclass
class Turn:
    store: SessionStore
    state: SessionState
    user_input: str
    generation: Generation
    renderer: ChatRenderer
    _closed: bool = False

    @property
    def request_id(self) -> str:
        return self.generation.request_id

    async def close(self) -> None:
        """Close the generation, record the turn if it ended well, release the session's lock."""
        if self._closed:
            return
        self._closed = True
        generation = self.generation
        try:
            await generation.close()
            if generation.finished and not generation.failed:
                answer = "".join(generation.record.texts)
                self.state.record(self.user_input, answer, samples_of(generation))
                if not await self.store.save(self.state):
                    log.info("session deleted during its turn", session_id=self.state.id)
        finally:
            await self.store.unlock_turn(self.state.id, self.request_id)


def samples_of(generation: Generation) -> TurnSamples:
    record = generation.record
    times, arrived = record.token_times, record.arrived
    return TurnSamples(
        prompt_tokens=generation.submission.num_prompt_tokens,
        completion_tokens=record.num_tokens,
        cached_tokens=record.num_cached_tokens,
        ttft_s=times[0] - arrived if times else 0.0,
        itl_s=[later - earlier for earlier, later in itertools.pairwise(times)],
        duration_s=(times[-1] if times else asyncio.get_running_loop().time()) - arrived,
        batch_sizes=record.batch_sizes,
        budget_missed=record.num_budget_missed,
    )


async def start_turn(
    gateway: Gateway, store: SessionStore, state: SessionState, body: SessionInfer, tenant: Tenant | None
) -> Turn:
    """Check the session's caps, take its lock, tokenize and submit; the caller must `close()`."""
    _check_caps(state)
    gateway.check_wait(tenant, state.qos.priority)  # before the lock and any work
    request_id = new_request_id("chatcmpl")
    await store.lock_turn(state.id, request_id, gateway.settings.request_timeout_s + 30.0)
    try:
        codec = gateway.ready_codec()
        messages = state.conversation(body.input)
        prompt = await gateway.encode_chat(codec, messages, "input")
        limits = [n for n in (body.token_limit, state.qos.max_tokens_per_turn) if n is not None]
        sampling = build_sampling(body, max_tokens=min(limits) if limits else None, logprobs=None)
        renderer = chat_renderer(
            codec, request_id, gateway.served_model, prompt, logprobs=False, include_usage=body.include_usage
        )
        submission = Submission(
            request_id,
            "session",
            prompt,
            sampling,
            "input",
            state.id.encode(),
            tenant=tenant,
            priority=state.qos.priority,
            latency_budget_ms=state.qos.latency_budget_ms or 0.0,
            sticky=state.routing.affinity,
        )
        generation = await Generation.start(gateway, submission)
    except BaseException:
        await store.unlock_turn(state.id, request_id)
        raise
    return Turn(store, state, body.input, generation, renderer)


def _check_caps(state: SessionState) -> None:
    qos = state.qos
    if qos.max_turns is not None and state.turns >= qos.max_turns:
        raise invalid(
            f"session '{state.id}' has had its {qos.max_turns} turns (qos.max_turns)",
            code="session_limit_reached",
        )
    used = state.prompt_tokens + state.completion_tokens
    if qos.max_total_tokens is not None and used >= qos.max_total_tokens:
        raise invalid(
            f"session '{state.id}' has used {used} of its {qos.max_total_tokens} tokens "
            "(qos.max_total_tokens)",
            code="session_limit_reached",
        )


class BackgroundTurns:
    """Asynchronous turns running on this gateway; `close` cancels what is left at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    async def launch(self, turn: Turn) -> RequestRecord:
        record = RequestRecord(
            id=turn.request_id, session_id=turn.state.id, status="running", created=turn.renderer.created
        )
        try:
            await turn.store.put_request(record)
        except BaseException:
            await turn.close()
            raise
        task = asyncio.create_task(self._run(turn, record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    async def _run(self, turn: Turn, record: RequestRecord) -> None:
        try:
            events = await turn.generation.collect()
            completion = turn.renderer.completion(events, turn.generation.num_tokens)
            record.status, record.result = "completed", completion.model_dump(mode="json")
        except GatewayError as exc:
            record.status, record.error = "failed", dict(exc.body()["error"])
        except asyncio.CancelledError:
            record.status = "failed"
            record.error = GatewayError(503, "the gateway shut down during the turn").body()["error"]
            raise
        finally:
            record.completed = now()
            await turn.close()
            with suppress(GatewayError):
                await turn.store.put_request(record)

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks)
