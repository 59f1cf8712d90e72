"""The lab (three hosts, a user's and an attacker's namespace on one bridge) and the cluster on it,
one per module: bringing them up costs most of a test's time."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.hosts import MultiHostCluster
from tests.multihost.netns import Lab, NetnsUnavailable, add_host, make_lab, wait_for
from tests.multihost.probes import in_ns, ready

# host -> services; a nats-server runs on every host
LAYOUT = {
    "a": ["gateway", "coordinator-1", "shard-1"],
    "b": ["coordinator-2", "shard-2"],
    "c": ["shard-3"],
}
USER_OCTET = 100  # the namespace the test's HTTP clients run in
ATTACKER_OCTET = 66
READY_WITHIN_S = 240.0
ENABLE_ENV = "MOHAWK_MULTIHOST"  # `make multihost` sets it: the suite takes minutes, `make test` skips it


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get(ENABLE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"multihost suite (2 to 6 minutes): `make multihost`, or {ENABLE_ENV}=1")
    for item in items:
        if item.path.parent == Path(__file__).parent:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    try:
        lab = make_lab(list(LAYOUT))
    except NetnsUnavailable as exc:
        pytest.skip(f"multihost tests make Linux network namespaces and could not: {exc}")
    try:
        add_host(lab, "user", USER_OCTET)
        add_host(lab, "attacker", ATTACKER_OCTET)
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[MultiHostCluster]:
    """The cluster; its data and logs stay in /tmp/mohawk-multihost-<run id>-* (pytest's own
    temporary folders are pruned by the next runs, often before anyone reads a failure's logs)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"mohawk-multihost-{lab.run_id}-"))
    running = MultiHostCluster(lab, data_dir, LAYOUT)
    try:
        running.start()
        wait_ready(running)
        yield running
    finally:
        running.stop()
        print(f"\nmultihost logs: {running.log_dir}")


def wait_ready(cluster: MultiHostCluster, timeout_s: float = READY_WITHIN_S) -> float:
    """Seconds until the gateway's /ready, asked from the user's namespace, says 200; fails at
    once, with its log's tail, when a child exits."""
    user = cluster.lab.host("user").netns

    def is_ready() -> bool:
        gone = cluster.exited()
        if gone:
            name, code = next(iter(gone.items()))
            raise AssertionError(f"{name} exited ({code}):\n{cluster.log_tail(name)}")
        return in_ns(user, lambda: ready(cluster.gateway_url), 10)

    return wait_for(is_ready, timeout_s, "the gateway's /ready says 200", poll_s=0.5)
