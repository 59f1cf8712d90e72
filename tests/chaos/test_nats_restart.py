"""Kill -9 nats-server under 16 concurrent greedy streams and start it again: nothing is lost or hangs.

Real processes: nats-server (file storage, so the request and token streams survive), a
coordinator, two shard nodes and the gateway. The server dies while every stream is generating,
stays down `DOWN_S`, and comes back on the same port and data directory. Frames in flight at the
kill are lost; stage 0's step deadlines (`node/step_deadlines.py`) give those steps up and resume
their sequences from the token stream, and the gateway reads back the token events it missed.
Every stream must then finish with exactly the text of an undisturbed run (no duplicate or
missing token) within `BOUND_S` of the restart, and no process may hold more memory than after
the same load undisturbed (`memory.py`). The short form (3 s down) runs in `make test`; the
full form (10 s down, as operators see a restart) in `make chaos`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import assert_identical, chaos_spec, streams_through
from tests.chaos.memory import grown, resident_bytes, settled

NUM_STREAMS = 16
BOUND_S = 60.0  # every stream done within this long after nats-server is back


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = chaos_spec(tmp_path_factory.mktemp("chaos-nats"), 2, MOHAWK_STEP_DEADLINE_FLOOR_S="2")
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


def _check(cluster: LocalCluster, reference: dict[str, str], down_s: float) -> None:
    streams_through(cluster, lambda: None, NUM_STREAMS)  # the same load undisturbed: steady allocations
    before = resident_bytes(cluster)

    async def restart() -> None:
        cluster.nats.kill()
        await asyncio.sleep(down_s)
        await asyncio.to_thread(cluster.nats.start)

    done, took = streams_through(cluster, restart, NUM_STREAMS, BOUND_S)
    print(f"\nnats-server down {down_s:.0f} s: all {len(done)} streams done {took:.1f} s after the restart")
    assert_identical(done, reference)
    for name, proc in cluster.processes.items():
        assert proc.poll() is None, f"{name} exited"
    assert not settled(lambda: grown(before, resident_bytes(cluster))), (
        "memory did not come back to its level"
    )


def test_nats_restart_loses_no_request(cluster: LocalCluster, reference: dict[str, str]) -> None:
    _check(cluster, reference, down_s=3.0)


@pytest.mark.slow
@pytest.mark.full_form
def test_nats_restart_after_ten_seconds_loses_no_request(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    _check(cluster, reference, down_s=10.0)
