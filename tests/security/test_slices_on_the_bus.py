"""Shard nodes with no model on their disk: each loads its signed, encrypted slice package from the
mohawk_slices object store, the planner gives each exactly its slice, and the pipeline serves the
same greedy text as the model file; a package made for another node is refused, and so is an
older signed package of a node's own put back in place of the newer one it loaded (a rollback)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from mohawk_pqc.pki_files import issue_node
from tests.cli.helpers import mohawk
from tests.integration.cluster_helpers import chat, current_plan

MODEL = "smollm2-135m-instruct"
PROMPT = "What is the capital of France? Tell me about it."  # not a near tie (tests/cli/test_generate_cli.py)


def mohawk_ok(*args: str) -> None:
    result = mohawk(*args, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def test_nodes_serve_from_slice_packages_and_refuse_another_nodes_package(tmp_path: Path) -> None:
    spec = ClusterSpec(
        nodes=0, port=free_port(), nats_port=free_port(), data_dir=tmp_path, threads_per_node=1
    )
    with LocalCluster(spec) as cluster:
        pki = cluster.pki_dir
        issue_node(pki, "shard-3", "shard", models=(MODEL,))
        slices = {
            "shard-1-old": ("shard-1", 0, 14),
            "shard-1": ("shard-1", 0, 14),
            "shard-2": ("shard-2", 14, 30),
        }
        for package, (node_id, start, end) in slices.items():  # shard-1's old package first
            if not (pki / "nodes" / node_id / "node.cert").exists():
                issue_node(pki, node_id, "shard", models=(MODEL,))
            out = tmp_path / "packages" / package
            mohawk_ok(
                "slice",
                "pack",
                "--start",
                str(start),
                "--end",
                str(end),
                "--node-id",
                node_id,
                "--pki-dir",
                str(pki),
                "--out",
                str(out),
            )
        for node_id in ("shard-1", "shard-2"):
            mohawk_ok(
                "slice",
                "push",
                "--package",
                str(tmp_path / "packages" / node_id),
                "--nats-url",
                cluster.nats.url,
            )
        cluster.add_node(["--weights-from", "bus"])
        cluster.add_node(["--weights-from", "bus"])
        cluster.wait_ready(timeout=300)
        plan = current_plan(cluster.nats.url)
        assert plan is not None
        assert [(s.node_id, s.start, s.end) for s in plan.stages] == [("shard-1", 0, 14), ("shard-2", 14, 30)]
        reply = chat(cluster.url, PROMPT, max_tokens=12)
        # the packages carry the file's Q4_1 blocks: the same kernels, the same text as the file
        expected = mohawk("generate", "--prompt", PROMPT, "--max-tokens", "12", timeout=300)
        assert expected.returncode == 0, expected.stderr[-2000:]
        assert reply["choices"][0]["message"]["content"] == expected.stdout.rstrip("\n")
        assert "Paris" in expected.stdout
        # shard-3 finds shard-1's package under its own name: it must refuse it and not start
        asyncio.run(_copy_object(cluster.nats.url, "shard-1", "shard-3"))
        name = cluster.add_node(["--weights-from", "bus"])
        code = cluster.processes[name].wait(120)
        log = (cluster.log_dir / f"{name}.log").read_text()
        assert code != 0 and "refused" in log and "Traceback" not in log
        # shard-1's older package (signed, its own) put back: shard-1, restarted, refuses it
        old = tmp_path / "packages" / "shard-1-old"
        mohawk_ok("slice", "push", "--package", str(old), "--nats-url", cluster.nats.url)
        cluster.kill("shard-1")
        cluster.respawn("shard-1")
        code = cluster.processes["shard-1"].wait(120)
        log = (cluster.log_dir / "shard-1.log").read_text()
        assert code != 0 and "replayed" in log and "Traceback" not in log


async def _copy_object(url: str, source_node: str, target_node: str) -> None:
    from mohawk_common.bus import names
    from mohawk_common.bus.connect import connect
    from mohawk_common.model_store.slice_fetch import fetch_slice

    nc = await connect([url], name="operator", attempts=3)
    try:
        js = nc.jetstream()
        package = await fetch_slice(js, MODEL, source_node)  # into one buffer (nats-py's get appends)
        store = await js.object_store(names.SLICES_BUCKET)
        await store.put(names.slice_object_name(MODEL, target_node), package.to_bytes())
    finally:
        await nc.close()
