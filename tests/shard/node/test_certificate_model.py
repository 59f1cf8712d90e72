"""`mohawk shard` with a certificate issued for another model refuses to start, in one line, before
it connects anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mohawk_pqc.pki_files import init_pki, issue_node


def test_a_shard_refuses_to_serve_a_model_its_certificate_is_not_for(tmp_path: Path) -> None:
    init_pki(tmp_path)
    bundle = issue_node(tmp_path, "shard-1", "shard", models=("model-a",))
    flags = ["--node-id", "shard-1", "--pki-dir", str(bundle), "--served-model-name", "model-b"]
    result = subprocess.run(
        [sys.executable, "-m", "mohawk_shard", *flags, "--nats-url", "nats://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    lines = [
        json.loads(line) for line in (result.stdout + result.stderr).splitlines() if line.startswith("{")
    ]
    refusals = [line for line in lines if line.get("event") == "refusing to start"]
    assert len(refusals) == 1
    assert refusals[0]["error"].startswith("shard-1's certificate is for model 'model-a', not 'model-b'")
