"""Sealing keys rotated on a schedule (`seal_schedule.SealSchedule`, `mohawk pki rotate-seal --due`),
against a real nats-server: nothing happens before a key is due; once it is, a new key goes to
the model's valid shard bundles and its record onto the PKI bucket; a failed rotation is said and
tried again at the next check."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mohawk_cli.seal_schedule import SealSchedule
from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_pqc.pki_files import DAY_S, init_pki, issue_node, seal_models_due
from mohawk_proto.v1 import security_pb2
from tests.cli.helpers import mohawk_in_process

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    init_pki(tmp_path / "pki")
    issue_node(tmp_path / "pki", "shard-1", "shard", models=(MODEL,))
    return tmp_path / "pki"


def published_number(url: str) -> int | None:
    async def read() -> int | None:
        nc = await connect(url, name="test", attempts=3)
        try:
            kv = await nc.jetstream().key_value(names.PKI_BUCKET)
            entry = await kv.get(names.seal_key_record_key(MODEL))
            record = security_pb2.SealKeyRecord.FromString(entry.value or b"")
            return security_pb2.SealKeyRecordBody.FromString(record.body).number
        except Exception:  # no bucket or no record yet
            return None
        finally:
            await nc.close()

    return asyncio.run(read())


def seal_key(pki: Path, bundle: str | None = None) -> bytes:
    base = pki / "nodes" / bundle / "seal" if bundle else pki / "seal"
    return next(base.glob("*.key")).read_bytes()


def test_a_key_is_rotated_once_it_is_due_and_not_before(pki: Path, nats_server: NatsServer) -> None:
    schedule = SealSchedule(pki, [nats_server.url], every_days=7, check_every_s=60)
    before = seal_key(pki)
    assert schedule.poll(now=0.0) == []  # a week has not passed
    assert seal_key(pki) == before and published_number(nats_server.url) is None
    a_week_on = time.time() + 7 * DAY_S + 60
    assert schedule.poll(now=30.0, wall_clock=a_week_on) == []  # checked at most once a minute
    assert schedule.poll(now=61.0, wall_clock=a_week_on) == [f"sealing key of {MODEL} rotated (every 7 days)"]
    assert seal_key(pki) != before and seal_key(pki, "shard-1") == seal_key(pki)  # the node's bundle too
    assert published_number(nats_server.url) == 1
    assert seal_models_due(pki, 7) == []  # the new key is fresh now


def test_a_failed_rotation_is_said_and_tried_again(pki: Path, nats_server: NatsServer) -> None:
    a_week_on = time.time() + 8 * DAY_S
    schedule = SealSchedule(pki, [f"nats://127.0.0.1:{free_port()}"], every_days=7, check_every_s=60)
    [said] = schedule.poll(now=0.0, wall_clock=a_week_on)
    assert "due for rotation, which failed" in said and "cannot reach NATS" in said
    schedule.servers = [nats_server.url]
    assert schedule.poll(now=61.0, wall_clock=a_week_on) == [f"sealing key of {MODEL} rotated (every 7 days)"]


def test_rotate_seal_due_rotates_nothing_fresh(pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = seal_key(pki)
    code, out, err = mohawk_in_process(capsys, "pki", "rotate-seal", "--due", "--pki-dir", str(pki))
    assert (code, out) == (0, "") and "no sealing key is 7 days old yet" in err
    assert seal_key(pki) == before
