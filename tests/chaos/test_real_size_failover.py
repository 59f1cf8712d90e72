"""The middle stage killed on a model of the size users run: SmolLM2-1.7B's shape (24 layers of 2048,
random weights) quantized to Q4_K_M by llama.cpp's own quantizer (`bench/real_shapes.py`, cached
outside the repository), split over three shard nodes, under 16 greedy streams. Without standbys
the two survivors load the dead node's layers while stage 0 keeps the requests; with them
(`standbys`) the neighbour after it holds those layers, with the KV the victim mirrored to it, and
takes them over with nothing to load or recompute. Every stream
ends with the text the same cluster gave undisturbed just before (the weights are random, so
that run is the reference). The figures it prints are docs/request-flow.md's.

Long form only: `make chaos` writes the file first (the `bench` extra, for llama.cpp's quantizer);
without the file the test says how to write it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.real_shapes import cache_dir, cached_name
from mohawk_cli.cluster import LocalCluster
from tests.chaos.clusters import (
    TimedKill,
    assert_identical,
    chaos_spec,
    events,
    logged_at,
    standby_held_for,
    streams_through,
)
from tests.integration.cluster_helpers import wait_for_stages

pytestmark = [pytest.mark.slow, pytest.mark.full_form]

SHAPE, TYPE = "smollm2-1.7b", "Q4_K_M"
NUM_STREAMS = 16
BOUND_S = 600.0  # 2 cores, three 1.7B stages and their loads


def model_path() -> Path:
    path = cache_dir() / cached_name(SHAPE, TYPE)
    if not path.is_file():
        pytest.skip(
            f"{path} is not written: `make chaos` writes it, or `.venv/bin/pip install -e '.[bench]'` "
            f"then `.venv/bin/python bench/real_shapes.py --shape {SHAPE} --types {TYPE}`"
        )
    return path


@pytest.mark.parametrize("standbys", [False, True], ids=["survivors-load", "standby"])
def test_a_1_7b_middle_stage_killed_under_16_streams(
    tmp_path_factory: pytest.TempPathFactory, standbys: bool
) -> None:
    spec = chaos_spec(
        tmp_path_factory.mktemp("chaos-1.7b"),
        3,
        MOHAWK_STANDBYS=str(standbys).lower(),
        MOHAWK_SERVED_MODEL_NAME="smollm2-135m-instruct",  # the name the streams ask for
    )
    with LocalCluster(dataclasses.replace(spec, model=str(model_path()))) as cluster:
        cluster.wait_ready(timeout=BOUND_S)
        plan = wait_for_stages(cluster, 3, timeout=BOUND_S)
        victim = plan.stages[1].node_id
        holder = standby_held_for(cluster, victim, BOUND_S)[1] if standbys else None
        calm: list[float] = []  # the same streams' longest waits with no fault: the floor under a stall
        undisturbed, _ = streams_through(cluster, lambda: None, NUM_STREAMS, BOUND_S, stalls=calm)
        reference = {prompt: text for prompt, (text, _) in undisturbed}
        stalls: list[float] = []
        across: list[float] = []
        after: list[float] = []
        kill = TimedKill(cluster, victim)
        done, took = streams_through(
            cluster, kill, NUM_STREAMS, BOUND_S, stalls=stalls, across=across, after=after
        )
        assert_identical(done, reference)
        loads = {
            node: [e for e in events(cluster, node, "stage loaded") if logged_at(e) > kill.at]
            for node in (s.node_id for s in plan.stages if s.node_id != victim)
        }
        assert all(loads.values()), loads
        if holder is not None:
            assert loads[holder][0]["from_standby"] is True, loads
            assert all(e["kept_weights"] for node, got in loads.items() if node != holder for e in got), loads
            # the victim mirrored its KV to the holder, which handed it on: nothing was recomputed
            kept = [
                e for e in events(cluster, holder, "kv kept for the next stage") if logged_at(e) > kill.at
            ]
            assert kept and kept[0]["mirrored"] > 0, kept
        slowest = max(e["load_s"] for got in loads.values() for e in got)
        before = {s.node_id: s.end - s.start for s in plan.stages}
        replanned = [e for e in events(cluster, "coordinator-1", "plan published") if logged_at(e) > kill.at]
        loaded = max(logged_at(got[0]) for got in loads.values()) - kill.at
        print(
            f"\n1.7B Q4_K_M, {before}, {victim} (middle) killed, standbys {'on' if standbys else 'off'}: "
            f"a plan without it {logged_at(replanned[0]) - kill.at:.3f} s later (detection), every stage "
            f"loaded {loaded:.3f} s after the kill, the longest load {slowest:.2f} s; all {len(done)} "
            f"streams done {took:.1f} s later, the longest stall {max(stalls):.2f} s, the longest across "
            f"the kill {max(across):.2f} s, the longest from the kill to a stream's next text "
            f"{max(after):.2f} s (undisturbed, the longest wait between two chunks {max(calm):.2f} s)"
        )
