"""`mohawk bus`, the inspector for machines without the `nats` CLI, against a real nats-server set
up as a cluster's bus (streams, consumers, buckets, a plan, heartbeats, sealed frames)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect, server_has_all
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.bus.setup import ensure_buckets, ensure_streams
from tests.cli.helpers import mohawk_in_process


@pytest.fixture
def bus(tmp_path: Path) -> NatsServer:
    server = NatsServer(tmp_path / "nats", monitor_port=free_port(), log_file=tmp_path / "nats.log").start()

    async def populate() -> None:
        nc = await connect([server.url], name="shard-shard-7", attempts=3)
        js = nc.jetstream()
        await ensure_streams(js)
        buckets = await ensure_buckets(js)
        await buckets.plan.put(names.PLAN_KEY, json.dumps({"version": 3, "state": "active"}).encode())
        await js.publish(names.request_subject("smollm2"), b"r1", headers={"Nats-Msg-Id": "r1"})
        await js.pull_subscribe(names.request_subject("smollm2"), durable="stage0-smollm2")
        await nc.close()

    asyncio.run(populate())
    yield server
    server.stop()


def test_streams_consumers_and_kv_read_like_the_nats_cli(
    bus: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "streams")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["stream", "subjects", "messages"]
    requests_row = next(line for line in lines if line.startswith(names.REQUESTS_STREAM))
    assert names.REQUESTS_WILDCARD in requests_row and " 1 " in requests_row  # one message stored

    code, out, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "streams", names.REQUESTS_STREAM)
    assert code == 0 and f"Stream {names.REQUESTS_STREAM}" in out and "messages:        1" in out

    code, out, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "consumers", names.REQUESTS_STREAM)
    row = next(line for line in out.splitlines() if line.startswith("stage0-smollm2"))
    assert row.split()[1:3] == ["pull", names.request_subject("smollm2")] and row.split()[3] == "1"  # pending

    code, out, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "kv", "ls")
    assert code == 0 and names.PLAN_BUCKET in out and names.LEADER_BUCKET in out
    code, out, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "kv", "ls", names.PLAN_BUCKET)
    assert out.split() == [names.PLAN_KEY]
    code, out, _ = mohawk_in_process(
        capsys, "bus", "--nats-url", bus.url, "kv", "get", names.PLAN_BUCKET, "current"
    )
    assert code == 0 and "revision 1" in out and '"version": 3' in out  # JSON shown pretty


def test_the_server_flag_goes_before_or_after_the_subcommand_and_as_s_like_the_nats_cli(
    bus: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _, expected, _ = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, "streams")
    for args in [
        ("bus", "streams", "--nats-url", bus.url),  # what `mohawk up`'s banner prints
        ("bus", "streams", "-s", bus.url),
        ("bus", "-s", bus.url, "streams"),
        ("bus", "--server", bus.url, "streams"),
        ("bus", "streams", "-s", bus.url, "--creds", "/nonexistent.creds"),
    ]:
        code, out, err = mohawk_in_process(capsys, *args)
        if "--creds" in args:  # parsed after the subcommand too: the missing file is what fails
            assert code == 1 and "nonexistent.creds" in err, err
            continue
        assert (code, out) == (0, expected), (args, err)
    code, out, _ = mohawk_in_process(capsys, "bus", "kv", "ls", names.PLAN_BUCKET, "-s", bus.url)
    assert code == 0 and out.split() == [names.PLAN_KEY]


def test_unknown_names_and_an_unreachable_server_are_one_line_errors(
    bus: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, status, text in [
        (("streams", "NOPE"), 2, "no stream 'NOPE'"),
        (("consumers", "NOPE"), 2, "no stream 'NOPE'"),
        (("kv", "ls", "nope"), 2, "no bucket 'nope'"),
        (("kv", "get", names.PLAN_BUCKET, "nope"), 2, "no key 'nope'"),
    ]:
        code, out, err = mohawk_in_process(capsys, "bus", "--nats-url", bus.url, *args)
        assert (code, out) == (status, "") and err.strip() == f"mohawk bus: {text}" + (
            f" in bucket '{names.PLAN_BUCKET}'" if args[0] == "kv" and args[1] == "get" else ""
        )
    code, _, err = mohawk_in_process(
        capsys, "bus", "--nats-url", f"nats://127.0.0.1:{free_port()}", "streams"
    )
    assert code == 1 and err.startswith("mohawk bus: ") and len(err.strip().splitlines()) == 1
    code, _, err = mohawk_in_process(
        capsys, "bus", "server", "--monitor-url", f"http://127.0.0.1:{free_port()}"
    )
    assert code == 1 and err.startswith("mohawk bus: cannot read") and len(err.strip().splitlines()) == 1


def test_server_reports_connections_and_jetstream_use(
    bus: NatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bus.monitor_url is not None
    code, out, _ = mohawk_in_process(capsys, "bus", "server", "--monitor-url", bus.monitor_url)
    assert code == 0
    assert "nats-server 2." in out and "JetStream:" in out and "streams," in out
    assert out.splitlines()[5].split()[0] == "connection"  # the connections table (none open now)


def test_sub_shows_senders_and_sizes_but_no_payload(bus: NatsServer) -> None:
    """A real subprocess, as an operator runs it; a heartbeat and an insecure frame go by once it
    says it is watching (it prints that after subscribing, however long its start took)."""
    from mohawk_common.bus.control import encode_json
    from mohawk_common.bus.frames import KIND_ACTIVATIONS, encode_frames
    from mohawk_proto.v1 import bus_pb2, security_pb2

    async def publish() -> None:
        nc = await connect([bus.url], name="probe", attempts=3)
        beat = bus_pb2.Heartbeat(node_id="shard-9", role="shard", stage=1, plan_version=4, loaded=True)
        await nc.publish(names.heartbeat_subject("shard-9"), encode_json(beat))
        header = security_pb2.FrameHeader(plan_version=4, stage=1, step_id=12, kind=KIND_ACTIVATIONS)
        for message in encode_frames(header, b"SECRET-ACTIVATIONS", 1 << 20, None):
            await nc.publish(names.activation_subject("shard-9", 4, 0, 1), message)
        await server_has_all(nc)
        await nc.close()

    command = [sys.executable, "-m", "mohawk_cli", "bus", "--nats-url", bus.url, "sub", f"{names.PREFIX}.>"]
    with subprocess.Popen(
        [*command, "--count", "2", "--timeout", "60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None
        first = process.stdout.readline()  # blocks until subscribed (or the process ends)
        started = time.monotonic()
        asyncio.run(publish())
        rest, stderr = process.communicate(timeout=90)
    assert process.returncode == 0, stderr
    assert time.monotonic() - started < 50, "the two messages published after 'watching' never arrived"
    lines = [first.rstrip("\n"), *rest.splitlines()]
    assert "encrypted" in lines[0]
    assert "heartbeat from shard-9 (shard): stage 1, plan 4, loaded" in lines[1]
    assert "activations, plan 4 stage 1 step 12; PLAINTEXT (insecure bus)" in lines[2]
    assert "SECRET" not in first + rest
