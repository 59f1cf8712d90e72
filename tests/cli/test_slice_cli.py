"""`mohawk slice pack|push` as an operator runs them, and a node fetching what was pushed."""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mohawk_cli.main import main
from mohawk_common.bus.server import NatsServer, free_port
from mohawk_common.model_store import open_model
from mohawk_common.model_store.slice_fetch import fetch_slice, fetch_slice_source
from mohawk_common.model_store.slice_source import SliceSource
from mohawk_pqc.errors import AuthenticationError
from mohawk_pqc.pki_files import init_pki, issue_node, load_bundle
from mohawk_pqc.slices import SlicePackage, open_slice
from tests.cli.helpers import mohawk

LAYERS = (5, 7)
MODEL = "smollm2-135m-instruct"


@dataclass
class Packed:
    pki: Path
    out: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    base = tmp_path_factory.mktemp("slice-cli")
    pki = base / "pki"
    init_pki(pki)
    for node in ("node-a", "node-b"):
        issue_node(pki, node, "shard")
    out = base / "pkg"
    result = mohawk(
        *("slice", "pack", "--start", str(LAYERS[0]), "--end", str(LAYERS[1]), "--node-id", "node-a"),
        *("--pki-dir", str(pki), "--policy-tag", "eu-only", "--policy-tag", "gpu"),
        *("--revision", "rev-7", "--out", str(out)),
    )
    return Packed(pki, out, result)


def test_pack_writes_a_package_only_its_node_opens(packed: Packed) -> None:
    assert packed.result.returncode == 0, packed.result.stderr
    assert "Traceback" not in packed.result.stderr
    assert f"wrote {packed.out}: layers [5, 7) of {MODEL} (revision rev-7) for node-a" in packed.result.stdout
    package = SlicePackage.read(packed.out)
    node_a = load_bundle(packed.pki / "nodes" / "node-a", role="shard")
    manifest, weights = open_slice(package, node_a.identity, node_a.trust, expect_model_revision="rev-7")
    assert len(weights) == manifest["size"]
    assert manifest["policy_tags"] == ["eu-only", "gpu"]
    assert manifest["served_model"] == MODEL and manifest["recipient_node_id"] == "node-a"
    assert (manifest["layer_start"], manifest["layer_end"]) == LAYERS
    node_b = load_bundle(packed.pki / "nodes" / "node-b", role="shard")
    with pytest.raises(AuthenticationError):
        open_slice(package, node_b.identity, node_b.trust)


def test_push_then_a_node_fetches_it(packed: Packed, nats_server: NatsServer) -> None:
    assert packed.result.returncode == 0, packed.result.stderr
    pushed = mohawk("slice", "push", "--package", str(packed.out), "--nats-url", nats_server.url)
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == f"pushed {packed.out} to mohawk_slices/{MODEL}/node-a"
    bundle = load_bundle(packed.pki / "nodes" / "node-a", role="shard")

    async def fetch() -> tuple[SlicePackage, SliceSource]:
        import nats

        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            package = await fetch_slice(js, MODEL, "node-a")
            source = await fetch_slice_source(
                js, MODEL, "node-a", bundle.identity, bundle.trust, expect_model_revision="rev-7"
            )
            return package, source
        finally:
            await nc.close()

    package, source = asyncio.run(fetch())
    assert package == SlicePackage.read(packed.out)  # byte-identical
    got = source.load_weights(*LAYERS, embedding=False, head=False)
    want = open_model().load_weights(*LAYERS, embedding=False, head=False)
    assert list(got) == list(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["slice", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1, captured.err
    return captured.err


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    pack = ("pack", "--start", "0", "--end", "2", "--out", str(tmp_path / "out"), "--pki-dir", str(pki))
    assert "root.key is missing" in _error(capsys, *pack, "--node-id", "node-a")
    init_pki(pki)
    assert "issue the node first" in _error(capsys, *pack, "--node-id", "node-a")
    assert "node id 'bad id'" in _error(capsys, *pack, "--node-id", "bad id")
    push = ("push", "--nats-url", f"nats://127.0.0.1:{free_port()}")
    assert "not a slice package" in _error(capsys, *push, "--package", str(tmp_path))
    issue_node(pki, "node-a", "shard")
    assert "does not exist" in _error(
        capsys, *pack, "--node-id", "node-a", "--model", str(tmp_path / "x.gguf")
    )
    package_dir = tmp_path / "fake"
    package_dir.mkdir()
    for name in ("manifest.sig", "weights.safetensors"):
        (package_dir / name).write_bytes(b"")
    (package_dir / "manifest.json").write_bytes(b"[]")
    assert "not a JSON object" in _error(capsys, *push, "--package", str(package_dir))
    (package_dir / "manifest.json").write_bytes(b"{}")
    assert "names no usable model and node" in _error(capsys, *push, "--package", str(package_dir))
    (package_dir / "manifest.json").write_bytes(b'{"served_model":"m","recipient_node_id":"n"}')
    assert "cannot reach NATS" in _error(capsys, *push, "--package", str(package_dir))
