"""Development PKI: processes sharing one directory issue themselves bundles from one root."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mohawk_common.bus.config import BusSettings
from mohawk_common.bus.security import Security
from mohawk_pqc.pki_files import ensure_dev_bundle, load_bundle


def test_processes_starting_together_share_one_root(tmp_path: Path) -> None:
    names = [f"shard-{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        bundles = list(pool.map(lambda n: ensure_dev_bundle(tmp_path, n, "shard", ("m",)), names))
    roots = {(b / "root.pub").read_bytes() for b in bundles}
    assert len(roots) == 1
    for bundle in bundles:
        loaded = load_bundle(bundle, role="shard")
        assert loaded.seal_key_for("m") is not None
    again = ensure_dev_bundle(tmp_path, "shard-0", "shard", ("m",))
    assert (again / "node.cert").read_bytes() == (bundles[0] / "node.cert").read_bytes()


def test_a_service_with_dev_pki_starts_secure(tmp_path: Path) -> None:
    settings = BusSettings.model_validate({"dev_pki_dir": tmp_path})
    security = Security.for_service(settings, role="gateway", process_id="gw", models=("m",))
    assert security.secure and security.require().seal_cert_for("m") is not None
    assert (
        Security.for_service(
            BusSettings.model_validate({"insecure": True}), role="gateway", process_id="x"
        ).bundle
        is None
    )
