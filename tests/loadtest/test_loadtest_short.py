"""The load test's short form against a 1-node cluster this test starts (`make test` runs it).

About 100 sessions of 2 turns and 10 chat clients of 2 requests, 8 tokens each, as three tenants
(gold 3, silver 2, bronze 1 with a low rpm quota), through `loadtest.run.run_load` exactly as
`python -m loadtest --short` runs them. Asserted: no request lost, hung, 5xx or failed otherwise;
429s only for bronze, every one with Retry-After, `rate_limit_exceeded` and x-ratelimit headers;
the JSON report and the PNG written with the keys the full run writes.

Reported, not asserted: the tenants' token shares against their weights, because at this size
they measure too little. Stage 0 pulls requests into its fair queue only while it has room (64
running, 8 waiting), and 110 streams of 8 tokens keep every tenant waiting for a first token for
only about a dozen one-second buckets, so the shares there follow arrival order more than weights.
RSS is asserted only loosely (no process more than 1.5 times its size before the run): a run of
half a minute after a warm-up of 20 requests is too short for allocators to settle within 10%.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from loadtest.run import run_load, write_outputs
from loadtest.spec import TenantSpec, standard_spec
from loadtest.table import markdown
from loadtest.target import Target, create_tenants, local_target
from mohawk_cli.redis_server import find_redis_server
from tests.real_parts import missing

REPORT_KEYS = {
    "spec",
    "target",
    "duration_s",
    "requests",
    "tokens",
    "latency",
    "errors",
    "rate_limited",
    "fairness",
    "memory",
    "buckets",
    "checks",
    "passed",
    "warmup",
}
LOOSE_RSS_GROWTH = 1.5


def test_short_load_test(tmp_path: Path) -> None:
    if find_redis_server() is None:
        missing("redis-server")
    spec = standard_spec(short=True)
    with local_target(tmp_path / "cluster") as target:
        report = asyncio.run(run_load(spec, target))
        check_second_turn_hits_the_prefix_cache(target)
    write_outputs(report, tmp_path / "report.json", tmp_path / "report.png", markdown(report))

    checks = {c["name"]: c for c in report["checks"]}
    for name in ("0 requests lost, hung or 5xx", "no other error, no turn left unsent"):
        assert checks[name]["result"] == "pass", checks[name]
    quota = next(c for name, c in checks.items() if name.startswith("429 only"))
    assert quota["result"] == "pass", quota
    requests = report["requests"]
    assert sum(t["generation_ok"] for t in requests.values()) == 220
    assert all(t["generation_ok"] == t["generation_requests"] for t in requests.values())
    limited = report["rate_limited"]
    assert limited["gold"]["count"] == limited["silver"]["count"] == 0
    bronze = limited["bronze"]
    assert bronze["with_retry_after"] == bronze["with_ratelimit_headers"] == bronze["count"]
    assert set(bronze["codes"]) <= {"rate_limit_exceeded"}

    assert report["tokens"]["total"] == 220 * spec.tokens_per_turn
    assert report["latency"]["overall"]["ttft_ms"]["count"] == 220
    assert report["generator"]["loop_lag_ms"]["count"] > 0
    assert {row["tenant"] for row in report["fairness"]["tenants"]} == {"gold", "silver", "bronze"}
    for process in report["memory"]["processes"]:
        if process["name"].startswith(("gateway", "shard")):
            assert process["after_mib"] <= LOOSE_RSS_GROWTH * process["before_mib"], process
            assert process["working_set_mib"] is not None, process  # read once a quarter had ended

    assert set(report) >= REPORT_KEYS
    written = json.loads((tmp_path / "report.json").read_text())
    assert set(written) >= REPORT_KEYS
    assert written["stamp"]["command"] and written["table"][0] == markdown(report).splitlines()[0]
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SYSTEM_PROMPT = "You answer questions about distributed systems. " * 8  # several whole KV blocks


def check_second_turn_hits_the_prefix_cache(target: Target) -> None:
    """A session's second turn repeats the first turn's prompt: its whole KV blocks come from the
    prefix cache, and both the answer's usage and the session's statistics count them."""
    (key,) = asyncio.run(
        create_tenants(target.redis_url, [TenantSpec(name="cachecheck", weight=1.0)])
    ).values()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=target.url, headers=headers, timeout=120) as client:
        created = client.post("/v1/sessions", json={"system_prompt": SYSTEM_PROMPT})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        turns = [
            client.post(
                f"/v1/sessions/{session_id}/infer", json={"input": text, "max_tokens": 4, "temperature": 0}
            )
            for text in ("What is a pipeline stage?", "And a replica?")
        ]
        assert all(turn.status_code == 200 for turn in turns), [turn.text for turn in turns]
        first, second = (turn.json()["usage"] for turn in turns)
        cached = second["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first["prompt_tokens"] // 16 * 16 - 16 > 0, (first, second)
        stats = client.get(f"/v1/sessions/{session_id}").json()
        assert stats["turns"] == 2 and stats["tokens"]["cached"] >= cached
