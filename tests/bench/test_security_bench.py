"""The short form of bench/security.py: handshake, request sealing and AEAD costs (`make test`), and
one alternating run of 32 concurrent streams on two 2-node clusters: as `mohawk up` runs (NATS with
TLS and users, frames encrypted) and everything off (plaintext on open NATS). The clusters' run is a
long-form case (`make bench` runs it, MOHAWK_FULL=1); that they serve encrypted over TLS NATS is
every cluster test's check, since `mohawk up`'s defaults are those. The full form (`make bench`) adds
the encrypted cluster on open NATS between them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench import run_bench


def check_micro(micro: dict[str, Any]) -> None:
    assert 0 < micro["handshake (3 messages, both sides)"]["median"] < 1000
    frames = [v["median"] for k, v in micro.items() if k.startswith("AES-256-GCM")]
    assert frames == sorted(frames)  # cost grows with the frame


def test_encryption_costs(tmp_path: Path) -> None:
    figures = run_bench("security.py", tmp_path / "security.json", "--micro-only")
    check_micro(figures["micro_ms"])
    assert figures["end_to_end_tps"] == {}


@pytest.mark.full_form
def test_encryption_costs_and_end_to_end_ratio(tmp_path: Path) -> None:
    figures = run_bench("security.py", tmp_path / "security.json")
    check_micro(figures["micro_ms"])
    e2e = figures["end_to_end_tps"]
    assert set(e2e) == {"encrypted, NATS TLS + auth", "plaintext (--insecure)"}
    ratio = e2e["encrypted, NATS TLS + auth"]["median"] / e2e["plaintext (--insecure)"]["median"]
    # The target is at most 5% lost to each layer (the full form measures both, docs/benchmarks.md). One short
    # run on a shared 2-core machine swings far more than that (a preflight with other clusters
    # running beside it measured 0.693), so the floor catches a real regression only: 0.75 for
    # each layer, as the two floors were when the short form ran three clusters.
    assert ratio >= 0.75 * 0.75, ratio
