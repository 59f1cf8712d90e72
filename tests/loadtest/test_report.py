"""The load test's statistics, checks and plot on synthetic samples: no cluster, no network."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest.cli import parse_args
from loadtest.measure import Recorder, RequestLog, error_class, stream_error_kind
from loadtest.memory import MIB, PeakSampler, compare
from loadtest.plot import write_png
from loadtest.report import build_report
from loadtest.spec import LoadSpec, TenantSpec, standard_spec
from loadtest.stats import (
    buckets,
    busy_buckets,
    busy_shares,
    itl_ms,
    outstanding_window,
    percentiles,
    shares,
    ttft_ms,
    window_shares,
)
from loadtest.table import markdown, memory_table

TENANTS = (TenantSpec("gold", 3.0), TenantSpec("silver", 2.0), TenantSpec("bronze", 1.0, rpm=1))


def stream(tenant: str, sent: float, chunks: list[float], *, num_tokens: int | None = None) -> RequestLog:
    log = RequestLog(tenant, "chat", queued_at=sent, sent_at=sent, chunk_times=list(chunks))
    log.first_token_at = chunks[0] if chunks else None
    log.ended_at = chunks[-1] if chunks else sent
    log.num_tokens = len(chunks) if num_tokens is None else num_tokens
    return log


def test_percentiles_are_numpys_linear_ones() -> None:
    p = percentiles([float(v) for v in range(1, 101)])
    assert p.count == 100
    assert p.p50 == pytest.approx(50.5)
    assert p.p95 == pytest.approx(95.05)
    assert p.p99 == pytest.approx(99.01)
    assert percentiles([0.25], scale=1000.0).p99 == pytest.approx(250.0)
    assert percentiles([]) == percentiles(())
    assert percentiles([]).p50 is None


def test_ttft_counts_from_the_answered_attempt_and_itl_between_chunks() -> None:
    late = stream("gold", 10.0, [10.5, 10.6, 10.8])
    late.queued_at = 2.0  # waited out 429s from 2 s to 10 s: not part of its TTFT
    assert ttft_ms([late]).p50 == pytest.approx(500.0)
    gaps = itl_ms([late, stream("gold", 0.0, [1.0])])
    assert gaps.count == 2
    assert gaps.p50 == pytest.approx(150.0)


def test_the_generators_loop_lag_is_reported_beside_the_latencies() -> None:
    report = build_report(
        LoadSpec(num_sessions=1, num_chat_clients=0, turns_per_session=1, tenants=TENANTS),
        recorder_of([stream("gold", 10.0, [13.0])]),
        [],
        target={"url": "http://x"},
        generator_lags_s=[0.001, 0.002, 0.5],
    )
    assert report["generator"]["loop_lag_ms"]["p50"] == pytest.approx(2.0)
    assert report["generator"]["max_loop_lag_ms"] == pytest.approx(500.0)
    assert "| load generator's loop lag p50 / p95 / p99, ms | 2 / " in markdown(report)


def recorder_of(logs: list[RequestLog]) -> Recorder:
    recorder = Recorder(clock=lambda: 0.0)
    recorder.requests.extend(logs)
    return recorder


def test_token_stamps_put_chunkless_tokens_at_the_last_chunk() -> None:
    assert stream("gold", 0.0, [1.0, 2.0], num_tokens=4).token_stamps() == [1.0, 2.0, 2.0, 2.0]
    assert stream("gold", 0.0, [1.0, 2.0], num_tokens=0).token_stamps() == [1.0, 2.0]  # failed mid-stream


def test_shares_against_weight_shares() -> None:
    weights = {"gold": 3.0, "silver": 2.0, "bronze": 1.0}
    exact = {s.tenant: s for s in shares({"gold": 300, "silver": 200, "bronze": 100}, weights)}
    assert exact["gold"].share == pytest.approx(0.5)
    assert exact["bronze"].weight_share == pytest.approx(1 / 6)
    assert all(s.deviation == pytest.approx(0.0) for s in exact.values())
    equal = {s.tenant: s for s in shares({"gold": 100, "silver": 100, "bronze": 100}, weights)}
    assert equal["gold"].deviation == pytest.approx(1 / 3 / 0.5 - 1)  # -33 %
    assert equal["bronze"].deviation == pytest.approx(1 / 3 / (1 / 6) - 1)  # +100 %
    assert not equal["gold"].within(0.10)
    assert exact["silver"].within(0.10)
    nothing = shares({}, weights)
    assert all(s.share is None and not s.within(0.10) for s in nothing)


def test_busy_means_waiting_for_a_first_token_for_the_whole_bucket() -> None:
    waiting = stream("gold", 0.2, [3.5, 3.6])  # waits from 0.2 s to 3.5 s
    other = stream("gold", 3.4, [5.0])  # overlaps the first: the union is 0.2 s to 5.0 s
    assert busy_buckets([waiting], "gold", 1.0, 6) == [False, True, True, False, False, False]
    assert busy_buckets([waiting, other], "gold", 1.0, 6) == [False, True, True, True, True, False]
    assert busy_buckets([waiting], "silver", 1.0, 6) == [False] * 6


def test_busy_counts_only_requests_queued_past_their_own_prefill() -> None:
    """With queued_after_s, a request counts from that long after it was sent: one answered within
    it (admitted at once, only prefilling) never makes its tenant busy."""
    queued = stream("gold", 0.2, [3.5])  # waited 3.3 s: queued from 2.2 s
    prompt = stream("gold", 3.0, [4.8])  # answered 1.8 s after it was sent
    assert busy_buckets([queued], "gold", 1.0, 6, queued_after_s=2.0) == [
        False,
        False,
        False,
        False,
        False,
        False,
    ]
    assert busy_buckets([queued], "gold", 1.0, 6, queued_after_s=1.0) == [
        False,
        False,
        True,
        False,
        False,
        False,
    ]
    assert busy_buckets([prompt], "gold", 1.0, 6, queued_after_s=2.0) == [False] * 6
    long_wait = stream("gold", 0.0, [5.9])
    assert busy_buckets([long_wait], "gold", 1.0, 6, queued_after_s=2.0) == [
        False,
        False,
        True,
        True,
        True,
        False,
    ]


def test_shares_count_only_buckets_where_every_tenant_is_busy() -> None:
    # gold waits through 0–4 s, silver only through 0–2 s: buckets 0 and 1 are all busy.
    requests = [
        stream("gold", 0.0, [4.0]),
        stream("silver", 0.0, [2.0]),
        stream("gold", 0.0, [0.5, 0.6, 0.7]),  # 3 tokens in bucket 0
        stream("silver", 0.0, [1.5, 3.5]),  # 1 token in bucket 1, 1 in bucket 3
    ]
    bucket_list = buckets(requests, ["gold", "silver"], 1.0)
    assert [b.all_busy for b in bucket_list] == [True, True, False, False, False]
    assert bucket_list[0].tokens == {"gold": 3, "silver": 0}
    assert bucket_list[2].tokens == {"gold": 0, "silver": 1}  # silver's first token at 2.0 s
    assert bucket_list[4].ttft_ms.p50 == pytest.approx(4000.0)
    result = {s.tenant: s for s in busy_shares(bucket_list, {"gold": 1.0, "silver": 1.0})}
    assert (result["gold"].tokens, result["silver"].tokens) == (3, 1)
    assert result["gold"].share == pytest.approx(0.75)


def test_the_outstanding_window_runs_from_the_last_tenant_in_to_the_first_tenant_out() -> None:
    early = stream("gold", 0.0, [1.0, 1.5, 2.0])
    late = stream("silver", 1.2, [1.8, 4.0])
    late.queued_at = 0.5  # queued at 0.5 s, sent at 1.2 s after a 429
    assert outstanding_window([early, late], ["gold", "silver"]) == (0.5, 2.0)
    result = {s.tenant: s.tokens for s in window_shares([early, late], {"gold": 1, "silver": 1}, (0.5, 2.0))}
    assert result == {"gold": 2, "silver": 1}  # gold's token at 2.0 s is past the window's end
    assert outstanding_window([early], ["gold", "silver"]) is None


def test_error_classes() -> None:
    assert error_class("hung") == "hung"
    assert error_class("lost") == "lost"
    assert error_class("transport:RemoteProtocolError") == "lost"
    assert error_class("timeout") == "timeout"
    assert error_class("http_503:None") == "5xx"
    assert error_class("http_429:rate_limit_exceeded") == "4xx"
    assert error_class(stream_error_kind({"type": "server_error", "code": None})) == "5xx"
    assert stream_error_kind({"type": "timeout", "code": "x"}) == "stream_504:x"


def test_standard_spec_deals_equal_work_and_only_bronze_can_be_refused() -> None:
    spec = standard_spec()
    demand = {t.name: spec.num_requests_of(t.name) for t in spec.tenants}
    assert demand == {"gold": 700, "silver": 700, "bronze": 700}
    assert [spec.can_be_refused(t) for t in spec.tenants] == [False, False, True]
    gold = spec.tenants[0]
    assert gold.rpm is not None and gold.rpm > demand["gold"]
    short = standard_spec(short=True)
    assert short.num_sessions == 100
    assert short.can_be_refused(short.tenants[2])


def synthetic_report(
    *,
    refusals: list[tuple[str, float | None]],
    reason: str = "tenant_rate_limit",
    ttft_objective_s: float | None = None,
) -> dict[str, Any]:
    """Three tenants getting tokens 3:2:1 for 4 s while each has a request waiting throughout."""
    spec = LoadSpec(
        num_sessions=3,
        num_chat_clients=0,
        turns_per_session=2,
        tenants=TENANTS,
        ttft_objective_s=ttft_objective_s,
    )
    recorder = Recorder(clock=lambda: 0.0)
    for tenant, weight in (("gold", 3), ("silver", 2), ("bronze", 1)):
        for second in range(4):
            recorder.requests.append(stream(tenant, second, [second + 0.1 * (i + 1) for i in range(weight)]))
        recorder.requests.append(stream(tenant, 0.0, [4.5]))  # waits through 0–4 s: busy
    for tenant, retry_after in refusals:
        recorder.refused(RequestLog(tenant, "chat", 0.0), "rate_limit_exceeded", retry_after, True, reason)
    # the gateway's working set (its load's connections) is 40 % over its idle size and stays: no
    # leak; the shard kept growing after its working set was in: 30 % more by the end
    memory = compare(
        before={"gateway": 100 * MIB, "shard-1": 200 * MIB},
        peak={"gateway": 150 * MIB, "shard-1": 260 * MIB},
        after={"gateway": 142 * MIB, "shard-1": 260 * MIB},
        working_set={"gateway": 140 * MIB, "shard-1": 200 * MIB},
    )
    return build_report(spec, recorder, memory, target={"url": "http://x"})


def test_report_checks_pass_on_a_fair_clean_run_but_memory() -> None:
    report = synthetic_report(refusals=[("bronze", 1.0)])
    results = {c["name"].split(" ")[0]: c["result"] for c in report["checks"]}
    assert list(results.values()) == ["pass", "pass", "pass", "pass", "fail"]  # shard-1 grew 30 %
    assert report["passed"] is False
    fairness = {row["tenant"]: row for row in report["fairness"]["tenants"]}
    assert fairness["gold"]["share"] == pytest.approx(0.5)
    assert report["fairness"]["all_busy_buckets"] == 2  # the first 2 s of a wait count as its prefill
    assert report["rate_limited"]["bronze"]["count"] == 1
    gateway, shard = report["memory"]["processes"]
    assert gateway["within"] is True and math.isclose(gateway["change"], 0.42)
    assert shard["within"] is False and math.isclose(shard["growth"], 0.3)
    table = markdown(report)
    assert "| TTFT p50 / p95 / p99, ms |" in table
    assert "| gateway and shard RSS after the run within 10% of their working set | fail |" in table
    assert "| gateway | 100.0 | 140.0 | 150.0 | 142.0 | +42.0% | +1.4% | yes |" in table


def test_a_429_for_a_tenant_within_quota_or_without_retry_after_fails() -> None:
    for refusal in (("gold", 1.0), ("bronze", None)):
        report = synthetic_report(refusals=[refusal])
        quota = next(c for c in report["checks"] if c["name"].startswith("429"))
        assert quota["result"] == "fail", refusal


def test_with_a_ttft_objective_any_tenant_may_be_refused_for_it_and_goodput_counts_the_timely() -> None:
    report = synthetic_report(
        refusals=[("gold", 1.0), ("silver", 2.0)], reason="ttft_objective", ttft_objective_s=1.0
    )
    quota = next(c for c in report["checks"] if c["name"].startswith("429"))
    assert quota["result"] == "pass", quota
    admission = report["admission"]
    assert admission["refused"] == 2 and 0 < admission["refused_share"] < 1
    # every request's first chunk comes 0.1 s after it is sent, but the three waiting ones' at 4.5 s
    assert admission["requests_within_objective"] == 12
    assert 0 < admission["goodput_tokens_per_s"] < admission["tokens_per_s"]
    table = markdown(report)
    assert "TTFT objective 1 s: 2 answers 429 for it" in table
    assert "| of which for the TTFT objective | 2 | 1 | 1 | 0 |" in table
    # 2 s with every tenant busy: too few to judge shares by under admission, which keeps queues short
    share = next(c for c in report["checks"] if c["name"].startswith("computed-token share"))
    assert share["result"] == "skipped" and "too few seconds" in share["detail"], share
    # without an objective the same 429s are a quota check's failure
    plain = synthetic_report(refusals=[("gold", 1.0)], reason="ttft_objective")
    assert next(c for c in plain["checks"] if c["name"].startswith("429"))["result"] == "fail"


def test_the_png_is_written(tmp_path: Path) -> None:
    path = tmp_path / "plots" / "report.png"
    write_png(synthetic_report(refusals=[]), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_computed_tokens_count_the_uncached_prompt_at_the_first_token() -> None:
    """Fair share divides computed tokens: a request's prompt tokens the prefix cache did not serve
    count where its prefill ended (its first token), then one per generated token."""
    first = stream("gold", 0.0, [1.5, 2.5])
    first.num_prompt_tokens, first.num_cached_tokens = 10, 4
    assert first.computed_stamps() == [1.5] * 6 + [1.5, 2.5]
    second = stream("silver", 0.0, [1.2])
    second.num_prompt_tokens = 3
    bucket_list = buckets([first, second], ["gold", "silver"], 1.0)
    assert [b.computed for b in bucket_list] == [
        {"gold": 0, "silver": 0},
        {"gold": 7, "silver": 4},
        {"gold": 1, "silver": 0},
    ]
    assert [b.tokens for b in bucket_list] == [
        {"gold": 0, "silver": 0},
        {"gold": 1, "silver": 1},
        {"gold": 1, "silver": 0},
    ]


def test_the_sampler_keeps_the_peak_and_the_reading_after_the_mark() -> None:
    """On this test's own process: no working set until marked, then one reading, kept."""
    pids = {"me": os.getpid()}
    with PeakSampler(pids, interval_s=0.01) as sampler:
        time.sleep(0.05)
        assert sampler.working_set == {}
        sampler.mark_working_set()
        deadline = time.monotonic() + 5.0
        while not sampler.working_set and time.monotonic() < deadline:
            time.sleep(0.01)
        first = dict(sampler.working_set)
        time.sleep(0.05)
    assert set(first) == {"me"} and sampler.working_set == first
    assert sampler.peak["me"] >= first["me"] > 0


def test_the_memory_table_of_a_later_run_stands_alone() -> None:
    report = synthetic_report(refusals=[])
    table = memory_table(report).splitlines()
    assert table[0].startswith("| process | RSS before, MiB")
    assert len(table) == 2 + len(report["memory"]["processes"])


def test_runs_must_be_at_least_one() -> None:
    assert parse_args(["--runs", "3"]).runs == 3 and parse_args([]).runs == 1
    with pytest.raises(SystemExit):
        parse_args(["--runs", "0"])
