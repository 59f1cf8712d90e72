"""A model's sealing key rotated on a real nats-server: processes follow the record in mohawk_pki.

After the operator revokes a shard and rotates the key, the gateway seals new requests to the new
certificate; a kept shard opens them and the revoked one cannot. A request sealed to the previous key
still opens on the kept shard until the keep window passes (an injected clock, no sleeping). A
record replayed from before, or signed by another root, changes nothing and is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mohawk_common.bus import names
from mohawk_common.bus.connect import connect
from mohawk_common.bus.requests import new_token_key, open_request, seal_request
from mohawk_common.bus.security import SEALED_REQUEST_LIFETIME_S, Security
from mohawk_common.bus.server import NatsServer
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.tasks import cancel_and_wait
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.kem import CryptographyKem
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle, revoke, rotate_seal_key
from mohawk_proto.v1 import bus_pb2, security_pb2
from tests.pqc.helpers import Clock

MODEL = "m"
WAIT_S = 10.0


def request(request_id: str) -> bus_pb2.GenerateRequest:
    now = time.time()
    return bus_pb2.GenerateRequest(
        request_id=request_id,
        model=MODEL,
        prompt_token_ids=[1, 2, 3],
        token_key=new_token_key(),
        created=now,
        deadline=now + 60,
    )


def refused(opening: Callable[[], object]) -> str:
    with pytest.raises(AuthenticationError) as info:
        opening()
    return info.value.reason


async def wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "the record did not arrive"
        await asyncio.sleep(0.02)


def test_after_a_rotation_only_kept_shards_open_new_requests_and_old_ones_until_the_window(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    pki = tmp_path / "pki"
    init_pki(pki)
    clock = Clock(time.time())
    processes = {
        node_id: Security(load_bundle(issue_node(pki, node_id, role, models=(MODEL,)), role=role),
                          CryptographyKem(), role=role, clock=clock)
        for node_id, role in (("gw", "gateway"), ("kept", "shard"), ("gone", "shard"))
    }  # fmt: skip
    gateway, kept, gone = processes["gw"], processes["kept"], processes["gone"]
    before = seal_request(request("before"), gateway)

    async def scenario() -> None:
        nc = await connect([nats_server.url], name="test", attempts=3)
        follows = []
        try:
            bucket = (await ensure_buckets(nc.jetstream())).pki
            follows = [asyncio.create_task(p.follow_revocations(bucket)) for p in processes.values()]
            revoke(pki, [gone.require().identity.body.serial])
            await bucket.put(names.CRL_KEY, (pki / "crl").read_bytes())
            first = rotate_seal_key(pki, MODEL, number=1, kem=CryptographyKem())
            second = rotate_seal_key(pki, MODEL, number=2, kem=CryptographyKem())
            key = names.seal_key_record_key(MODEL)
            await bucket.put(key, second.SerializeToString())
            newest = security_pb2.SealKeyRecordBody.FromString(second.body).certificate
            # each process follows the bucket on its own watcher: wait for every one of them
            await wait_for(lambda: gone.rejections["untrusted"] == 1)  # no copy for the revoked node
            await wait_for(lambda: gateway.require().seal_cert_for(MODEL) == newest)
            await wait_for(lambda: kept.require().seal_cert_for(MODEL) == newest)
            assert gone.require().seal_cert_for(MODEL) != newest  # it kept nothing of the record

            after = seal_request(request("after"), gateway)
            assert open_request(*after, kept, MODEL).request_id == "after"
            assert refused(lambda: open_request(*after, gone, MODEL)) == "untrusted"

            await bucket.put(key, first.SerializeToString())  # an older record, replayed
            await wait_for(lambda: kept.rejections["replayed"] == 1)
            await wait_for(lambda: gateway.rejections["replayed"] == 1)
            assert kept.require().seal_cert_for(MODEL) == newest

            other = tmp_path / "other"
            init_pki(other)
            issue_node(other, "kept", "shard", models=(MODEL,))
            foreign = rotate_seal_key(other, MODEL, number=99, kem=CryptographyKem())
            await bucket.put(key, foreign.SerializeToString())
            await wait_for(lambda: kept.rejections["tampered"] == 1)
            assert kept.require().seal_cert_for(MODEL) == newest
        finally:
            with contextlib.suppress(Exception):  # a follower's own error is not this test's
                await cancel_and_wait(*follows)
            await nc.close()

    asyncio.run(scenario())

    assert open_request(*before, kept, MODEL).request_id == "before"  # sealed to the previous key
    clock.now += SEALED_REQUEST_LIFETIME_S - 1
    assert open_request(*before, kept, MODEL).request_id == "before"
    clock.now += 2  # the window has passed: the previous key is dropped
    assert refused(lambda: open_request(*before, kept, MODEL)) == "untrusted"
    assert open_request(*seal_request(request("later"), gateway), kept, MODEL).request_id == "later"
