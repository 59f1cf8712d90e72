"""The short form of bench/security.py: handshake, request sealing and AEAD costs, and one alternating
run of 32 concurrent streams on three 2-node clusters: NATS with TLS and users, encrypted on open
NATS, plaintext on open NATS."""

from __future__ import annotations

from pathlib import Path

from tests.bench import run_bench


def test_encryption_costs_and_end_to_end_ratio(tmp_path: Path) -> None:
    figures = run_bench("security.py", tmp_path / "security.json")
    micro = figures["micro_ms"]
    assert 0 < micro["handshake (3 messages, both sides)"]["median"] < 1000
    frames = [v["median"] for k, v in micro.items() if k.startswith("AES-256-GCM")]
    assert frames == sorted(frames)  # cost grows with the frame
    e2e = figures["end_to_end_tps"]
    ratio = e2e["encrypted"]["median"] / e2e["plaintext (--insecure)"]["median"]
    # The target is at most 5% lost (the full form measures it, README). One short run on a shared
    # 2-core machine swings more than that, so the floor here catches a real regression only.
    assert ratio >= 0.75, ratio
    nats_ratio = e2e["encrypted, NATS TLS + auth"]["median"] / e2e["encrypted"]["median"]
    assert nats_ratio >= 0.75, nats_ratio  # the same for NATS's TLS and auth
