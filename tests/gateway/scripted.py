"""Test doubles for the gateway: a word-level tokenizer and `ScriptedPipeline`, a stand-in for stage 0
plus the last stage that speaks the real bus protocol (plan in KV, requests from the durable
REQUESTS stream, token events on `mohawk.v1.tok.<request>`, cancels on `mohawk.v1.cancel.<request>`)
and answers with scripted token events chosen by a keyword in the prompt.

Keywords: `error` (an error event, status 400), `lateerror` (one token, then an error), `hang`
(nothing until cancelled), `slow` (a token every 0.1 s until cancelled or 50 tokens), `shuffle`
(events out of order).
Anything else gets "Hello world!" as three tokens, with duplicates of earlier indexes mixed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mohawk_common.bus import names
from mohawk_common.bus.config import BUNDLED_MODEL_NAME
from mohawk_common.bus.connect import connect
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.setup import BusLimits, ensure_buckets, ensure_streams
from mohawk_common.tasks import cancel_and_wait
from mohawk_proto.v1 import bus_pb2, engine_pb2

T = TypeVar("T")
MODEL = BUNDLED_MODEL_NAME
REPLY = ("Hello", " world", "!")
HEARTBEAT_INTERVAL_S = 0.5


class FakeTokenizer:
    """Each whitespace-separated word is one token; ids are given out on first sight (thread-safe)."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")
    VOCAB_SIZE = 1000
    chat_template = "{% fake %}"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._words: list[str] = list(self.SPECIALS)
        self._ids = {word: i for i, word in enumerate(self._words)}

    def token_id(self, word: str) -> int:
        with self._lock:
            if word not in self._ids:
                self._ids[word] = len(self._words)
                self._words.append(word)
            return self._ids[word]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [self.token_id(word) for word in text.split()]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        with self._lock:
            return " ".join(self._words[i] if i < len(self._words) else "<unk>" for i in token_ids)

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> str:
        turns = [f"<|{m['role']}|> {m['content']}" for m in conversation]
        return " ".join([*turns, "<|assistant|>"])

    def __len__(self) -> int:
        return self.VOCAB_SIZE


@dataclass
class ScriptedPipeline:
    """Stage 0 and the last stage in one, in a thread with its own event loop; see the module doc."""

    url: str
    tokenizer: FakeTokenizer
    model: str = MODEL
    limits: BusLimits = field(default_factory=BusLimits)
    requests: list[bus_pb2.GenerateRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def start(self, *, plan_state: str | None = "active", max_model_len: int = 64) -> ScriptedPipeline:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._cancel_events: dict[str, asyncio.Event] = {}
        self.call(self._setup())
        if plan_state is not None:
            self.set_plan(plan_state, max_model_len)
        return self

    def stop(self) -> None:
        self.call(self._teardown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def set_plan(self, state: str = "active", max_model_len: int = 64, version: int = 1) -> None:
        plan = bus_pb2.Plan(version=version, model=self.model, max_model_len=max_model_len, state=state)
        plan.stages.add(node_id="scripted", start=0, end=30)
        self.call(self._buckets.plan.put(names.PLAN_KEY, encode_json(plan)))

    def prompt_text(self, index: int = -1) -> str:
        return self.tokenizer.decode(self.requests[index].prompt_token_ids)

    async def _setup(self) -> None:
        self._nc = await connect(self.url, name="scripted-pipeline", attempts=3)
        self._js: JetStreamContext = self._nc.jetstream()
        await ensure_streams(self._js, self.limits)
        self._buckets = await ensure_buckets(self._js, self.limits)
        await self._nc.subscribe(names.CANCEL_WILDCARD, cb=self._on_cancel)
        self._pull = await self._js.pull_subscribe(
            names.request_subject(self.model),
            durable=names.stage0_consumer(self.model),
            stream=names.REQUESTS_STREAM,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._puller = asyncio.create_task(self._pull_loop())
        self._heartbeats = asyncio.create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        """Heartbeat as a loaded node does: the gateway is ready only while the plan's nodes do."""
        heartbeat = bus_pb2.Heartbeat(node_id="scripted", role="shard", model=self.model, loaded=True)
        while True:
            with contextlib.suppress(Exception):
                await self._nc.publish(names.heartbeat_subject("scripted"), encode_json(heartbeat))
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    async def _teardown(self) -> None:
        with contextlib.suppress(Exception):  # one cancel can be lost inside nats-py on 3.11
            await cancel_and_wait(self._puller, self._heartbeats, *self._tasks)
        with contextlib.suppress(Exception):  # the test may have killed the server
            await self._nc.close()
        leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        with contextlib.suppress(Exception):  # their own errors, as gather(return_exceptions) kept them
            await cancel_and_wait(*leftovers)

    async def _on_cancel(self, msg: Msg) -> None:
        request_id = msg.subject.rsplit(".", 1)[-1]
        self.cancelled.append(request_id)
        self._cancel_events.setdefault(request_id, asyncio.Event()).set()

    async def _pull_loop(self) -> None:
        while True:
            try:
                msgs = await self._pull.fetch(1, timeout=0.2)
            except Exception:  # fetch timeout with nothing queued, mostly
                # or the consumer deleted under it (test_internal_errors): a retry at once can keep
                # this loop from ever yielding to the teardown scheduled on it, which a preflight
                # saw time out after that test; so pause as stage 0's own pull loop does
                await asyncio.sleep(0.02)
                continue
            for msg in msgs:
                task = asyncio.create_task(self._serve(msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Msg) -> None:
        request = bus_pb2.GenerateRequest.FromString(msg.data)
        self.requests.append(request)
        cancel = self._cancel_events.setdefault(request.request_id, asyncio.Event())
        words = set(self.tokenizer.decode(request.prompt_token_ids).split())
        script = next((w for w in ("lateerror", "error", "hang", "slow", "shuffle") if w in words), "")
        if script == "hang":
            await cancel.wait()
        elif script == "slow":
            await self._slow(request, cancel)
        else:
            for event in self._events(request, script):
                await self._publish(request.request_id, event)
        await msg.ack()

    def _events(self, request: bus_pb2.GenerateRequest, script: str) -> list[engine_pb2.TokenEvent]:
        rid = request.request_id
        if script == "error":
            return [engine_pb2.TokenEvent(request_id=rid, error="prompt refused", error_status=400)]
        tokens = [self._token(request, i, text) for i, text in enumerate(REPLY)]
        limit = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else len(tokens)
        tokens = tokens[: min(limit, len(tokens))]
        if script == "lateerror":
            error = engine_pb2.TokenEvent(request_id=rid, index=1, error="stage lost", error_status=500)
            return [tokens[0], error]
        last = tokens[-1]
        last.finish_reason = "length" if len(tokens) < len(REPLY) else "stop"
        last.usage.CopyFrom(_usage(len(request.prompt_token_ids), len(tokens)))
        if script == "shuffle":
            return list(reversed(tokens))
        # every index but the last twice, as a pipeline that recovered mid-request may send them
        return [tokens[0], *tokens[:-1], *tokens[1:]]

    async def _slow(self, request: bus_pb2.GenerateRequest, cancel: asyncio.Event) -> None:
        for index in range(50):
            if cancel.is_set():
                return
            await self._publish(request.request_id, self._token(request, index, f" w{index}"))
            await asyncio.sleep(0.1)
        final = engine_pb2.TokenEvent(request_id=request.request_id, index=50, finish_reason="length")
        await self._publish(request.request_id, final)

    def _token(self, request: bus_pb2.GenerateRequest, index: int, text: str) -> engine_pb2.TokenEvent:
        event = engine_pb2.TokenEvent(
            request_id=request.request_id,
            index=index,
            token_id=self.tokenizer.token_id(text.strip()),
            text=text,
        )
        if request.sampling.HasField("logprobs"):
            event.logprob = -0.25 * (index + 1)
            for k in range(request.sampling.logprobs):
                event.top_logprobs.add(token_id=self.tokenizer.token_id(f"alt{k}"), logprob=-1.0 - k)
        return event

    async def _publish(self, request_id: str, event: engine_pb2.TokenEvent) -> None:
        """As the last stage does: JetStream, so the TOKENS stream keeps the event for replays."""
        await self._js.publish(names.token_subject(request_id), event.SerializeToString())


def _usage(num_prompt: int, num_completion: int) -> engine_pb2.Usage:
    return engine_pb2.Usage(
        prompt_tokens=num_prompt, completion_tokens=num_completion, total_tokens=num_prompt + num_completion
    )
