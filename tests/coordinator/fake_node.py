"""A test double of a shard node's heartbeat: real `Heartbeat` JSON on mohawk.v1.hb.<node>."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client

from mohawk_common.bus import names
from mohawk_common.bus.control import encode_json
from mohawk_common.bus.control_records import sign_record
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.identity import Identity
from mohawk_proto.v1 import bus_pb2

MIB = 2**20
MODEL = "smollm2-135m-instruct"


def describe_model(heartbeat: bus_pb2.Heartbeat, layer_mib: float = 13.5) -> bus_pb2.Heartbeat:
    """Fill in the model's shape as a node reports it: SmolLM2-135M-like, fp32 weights (30 layers
    of `layer_mib` MiB, 108 MiB embedding, 108 MiB head)."""
    heartbeat.model_id = "tiny-llama"
    heartbeat.num_layers = 30
    heartbeat.hidden_size = 576
    heartbeat.vocab_size = 49152
    heartbeat.num_kv_heads = 3
    heartbeat.head_dim = 64
    heartbeat.max_position_embeddings = 8192
    heartbeat.layer_weight_bytes = int(layer_mib * MIB)
    heartbeat.embedding_weight_bytes = 108 * MIB
    heartbeat.head_weight_bytes = 108 * MIB
    heartbeat.weights_format = "fp32"
    return heartbeat


class FakeNode:
    """Heartbeats every `interval_s` until stopped; tests change its fields between beats."""

    def __init__(
        self,
        nc: Client,
        node_id: str,
        *,
        model: str = MODEL,
        memory_limit_bytes: int = 2048 * MIB,
        kv_cache_bytes: int = 256 * MIB,
        seconds_per_layer: float = 1e-3,
        kv_block_bytes_per_layer: int = 16 * 1536,
        interval_s: float = 0.2,
        identity: Identity | None = None,
    ) -> None:
        self.nc = nc
        self.identity = identity  # signs each heartbeat, as a certified node does
        self.interval_s = interval_s
        self.started_at_ms = int(time.time() * 1000)
        heartbeat = bus_pb2.Heartbeat(
            node_id=node_id,
            model=model,
            backend="torch",
            device="cpu",
            total_memory_bytes=8192 * MIB,
            free_memory_bytes=4096 * MIB,
            memory_limit_bytes=memory_limit_bytes,
            kv_cache_bytes=kv_cache_bytes,
            seconds_per_layer=seconds_per_layer,
            plan_version=0,
            stage=-1,
            loaded=False,
            started_at_ms=self.started_at_ms,
            kv_block_bytes_per_layer=kv_block_bytes_per_layer,
            role="shard",
        )
        self.heartbeat = describe_model(heartbeat)
        self._task: asyncio.Task[None] | None = None
        self.last_sent = b""

    @property
    def node_id(self) -> str:
        return self.heartbeat.node_id

    def report_loaded(self, plan_version: int, stage: int, loaded: bool = True) -> None:
        self.heartbeat.plan_version = plan_version
        self.heartbeat.stage = stage
        self.heartbeat.loaded = loaded

    async def beat(self) -> None:
        self.heartbeat.sent_at = time.time()
        self.heartbeat.sequence += 1
        if self.identity is not None:
            sign_record(self.heartbeat, self.identity, "heartbeat")
        self.last_sent = encode_json(self.heartbeat)  # what a recorder on the bus would have
        await self.nc.publish(names.heartbeat_subject(self.node_id), self.last_sent)

    async def start(self) -> FakeNode:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Stop heartbeating, like a node that died."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.interval_s)
