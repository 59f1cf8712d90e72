"""One hop between stages, end to end on loopback: a decode step's hidden states serialized
(`StepBatch` + raw bytes), sealed with AES-256-GCM under the frame header (the channel's
`FrameSender`), published on core NATS, received by another connection, opened
(`FrameReceiver`) and parsed back, as `node/link.py` does for every step. A real nats-server (the
wheel's) on a free port; both clients in one process, so one clock times the hop. Prints the
median and p99 over `--hops` hops for each row count and width, in ms.

usage: python bench/hops.py [--hops 2000] [--hidden 576,2048] [--rows 1,32] [--dtype float32,bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import numpy as np
from results_file import write_results

from mohawk_common.bus.frames import (
    KIND_ACTIVATIONS,
    FrameAssembler,
    activation_payload,
    encode_frames,
    read_activation_payload,
    split_message,
)
from mohawk_common.bus.server import NatsServer
from mohawk_pqc.channel import FrameReceiver, FrameSender
from mohawk_proto.v1 import engine_pb2, security_pb2

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class _Channel:  # what encode_frames reads of a SecureChannel
    channel_id: bytes
    sender: FrameSender


def step_batch(rows: int) -> engine_pb2.StepBatch:
    step = engine_pb2.StepBatch(step_id=1, started_at=time.time())
    for seq in range(rows):
        step.sequences.add(seq_id=seq, start_position=300, num_new_tokens=1, token_ids=[1234], sample=True)
    return step


async def measure(url: str, rows: int, hidden: int, dtype: str, hops: int) -> list[float]:
    key = os.urandom(32)
    channel = _Channel(os.urandom(16), FrameSender(key))
    receiver, assembler = FrameReceiver(key), FrameAssembler()
    publisher, subscriber = await nats.connect(url), await nats.connect(url)
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def on_message(message: nats.aio.msg.Msg) -> None:
        header, raw, body = split_message(message.data)
        chunk = receiver.decrypt(header.seq, header.key_epoch, raw, body)
        whole = assembler.add(header, chunk)
        if whole is not None:
            _step, states = read_activation_payload(whole[1])
            np.frombuffer(states, dtype=np.uint8)  # the receiver's view of the tensor bytes
            arrived.put_nowait(time.perf_counter())

    await subscriber.subscribe("mohawk.bench.hop", cb=on_message)
    await subscriber.flush()
    states = os.urandom(rows * hidden * BYTES[dtype])
    seconds = []
    for _ in range(hops + 50):
        started = time.perf_counter()
        header = security_pb2.FrameHeader(
            plan_version=1, stage=1, step_id=1, dtype=dtype, shape=[rows, hidden], kind=KIND_ACTIVATIONS,
            sent_at=time.time(),
        )  # fmt: skip
        payload = activation_payload(step_batch(rows), states)
        for message in encode_frames(header, payload, publisher.max_payload, channel):  # type: ignore[arg-type]
            await publisher.publish("mohawk.bench.hop", message)
        await publisher.flush()
        seconds.append(await asyncio.wait_for(arrived.get(), 5.0) - started)
    await publisher.close()
    await subscriber.close()
    return seconds[50:]  # the first hops warm the connections


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hops", type=int, default=2000)
    parser.add_argument("--hidden", default="576,2048")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lines = ["| rows × hidden | dtype | bytes | median, ms | p99, ms |", "|---|---|---|---|---|"]
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        server = NatsServer(Path(folder)).start()
        try:
            for hidden in (int(h) for h in args.hidden.split(",")):
                for rows in (int(r) for r in args.rows.split(",")):
                    for dtype in args.dtype.split(","):
                        hop = asyncio.run(measure(server.url, rows, hidden, dtype, args.hops))
                        median, p99 = statistics.median(hop) * 1e3, float(np.percentile(hop, 99)) * 1e3
                        size = rows * hidden * BYTES[dtype]
                        lines.append(f"| {rows} × {hidden} | {dtype} | {size} | {median:.3f} | {p99:.3f} |")
                        figures.append(
                            {
                                "rows": rows,
                                "hidden": hidden,
                                "dtype": dtype,
                                "median_ms": median,
                                "p99_ms": p99,
                            }
                        )
        finally:
            server.stop()
    print("\n".join(lines))
    if args.json:
        write_results(args.json, {"hops": figures}, lines)


if __name__ == "__main__":
    main()
