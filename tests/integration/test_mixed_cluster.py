"""A torch/MLX/torch pipeline as real processes: `mohawk up --nodes 3 --backends torch,mlx,torch`.

The MLX node reports its backend and measured speed, the planner weighs it, 8 concurrent requests
each equal their solo run on the single-process torch engine, and when the MLX stage is killed a
replacement MLX node takes its place and serving goes on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from tests.integration.cluster_helpers import (
    MIXED_BACKENDS_WEIGHTS,
    PROMPTS,
    chat,
    current_plan,
    reference_texts,
    stream_many,
)

pytest.importorskip("mlx_lm", reason="the mlx extra (mlx, mlx-cpu, mlx-lm) is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        nodes=3,
        backends=("torch", "mlx", "torch"),
        port=free_port(),
        nats_port=free_port(),
        data_dir=tmp_path_factory.mktemp("mixed"),
        threads_per_node=1,
        env={"MOHAWK_LEASE_TTL_S": "2.0", "MOHAWK_WEIGHTS": MIXED_BACKENDS_WEIGHTS},
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=300)
        # the coordinator plans once the live nodes have settled for plan_settle_s: on a slow
        # machine the MLX node can measure itself after that, and joins by the next plan
        deadline = time.monotonic() + 180
        while (
            (plan := current_plan(running.nats.url)) is None or len(plan.stages) < 3 or plan.state != "active"
        ):
            assert time.monotonic() < deadline, f"the MLX node never joined the plan: {plan}"
            time.sleep(0.5)
        running.wait_ready(timeout=300)
        yield running


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """The single-process torch engine's texts in the weights this cluster runs."""
    return reference_texts(MIXED_BACKENDS_WEIGHTS)


def test_the_slower_mlx_node_gets_fewer_layers(cluster: LocalCluster) -> None:
    """MLX on a Linux CPU (mlx-cpu's reference BLAS) measures ~4x slower per layer than torch here,
    so the planner, which balances layers × measured seconds per layer, gives it the fewest."""
    plan = current_plan(cluster.nats.url)
    assert plan is not None and plan.state == "active"
    assert [s.node_id for s in plan.stages] == ["shard-1", "shard-2", "shard-3"]
    assert plan.stages[0].start == 0 and plan.stages[-1].end == 30
    layers = [s.end - s.start for s in plan.stages]
    assert layers[1] < min(layers[0], layers[2]), layers


def test_8_concurrent_requests_each_match_their_solo_run(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    results = stream_many(cluster.url, PROMPTS, 24)
    for prompt, (text, finish) in zip(PROMPTS, results, strict=True):
        assert finish in ("stop", "length")
        assert text == reference[prompt], prompt


def test_the_mlx_stage_killed_and_replaced_keeps_serving(
    cluster: LocalCluster, reference: dict[str, str]
) -> None:
    before = current_plan(cluster.nats.url)
    assert before is not None
    cluster.kill("shard-2")
    cluster.add_node(["--backend", "mlx"])
    deadline = time.monotonic() + 180
    while True:
        plan = current_plan(cluster.nats.url)
        names = [s.node_id for s in plan.stages] if plan is not None else []
        if plan is not None and plan.state == "active" and "shard-4" in names and "shard-2" not in names:
            break
        assert time.monotonic() < deadline, f"no active plan with the replacement: {names}"
        time.sleep(0.3)
    assert chat(cluster.url, PROMPTS[1])["choices"][0]["message"]["content"] == reference[PROMPTS[1]]
