"""The report of one run: a JSON-ready dict and the acceptance checks.

Design. `build_report` turns the recorder's logs, the RSS figures and the spec into one plain dict
(what `--json` writes, and what the plot and the markdown tables read); `checks` judges it against
the load test's acceptance criteria. Each check is "pass", "fail" or "skipped" (no
figures to judge: RSS of a cluster this run did not start), with the figures that decided it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.measure import Recorder, RequestLog, error_class
from loadtest.memory import MIB, MemoryRow
from loadtest.spec import LoadSpec, TenantSpec
from loadtest.stats import (
    Percentiles,
    buckets,
    busy_buckets,
    busy_shares,
    generations,
    itl_ms,
    num_tokens,
    outstanding_window,
    percentiles,
    tokens_per_s,
    ttft_ms,
    window_shares,
)

SHARE_TOLERANCE = 0.10
# With a TTFT objective, admission keeps every tenant's queue short on purpose, so seconds in which
# every tenant is backlogged are few (2 to 10 of ~220 in a run); shares over fewer than this many
# are a handful of requests each, not a measure of fair share, and the check says so instead.
MIN_JUDGED_BUSY_S_WITH_OBJECTIVE = 10
MEMORY_TOLERANCE = 0.10
FAILURE_CLASSES = ("lost", "hung", "5xx", "timeout")
OBJECTIVE_REFUSAL = "ttft_objective"  # the gateway's X-Mohawk-Refusal for a predicted wait past the objective
BUSY_DEFINITION = (
    "a tenant is busy for a whole bucket when, throughout it, at least one of its generation "
    "requests had been waiting for its first token for longer than queued_after_s (so it was "
    "queued at stage 0, not in its own prefill); shares count the tokens computed for each tenant "
    "(prompt tokens the prefix cache did not serve, at the first token, and generated tokens: the "
    "unit stage 0's fair share counts) in the buckets where every tenant was busy; "
    "generated_share counts generated tokens only"
)
CHECKED_PROCESSES = ("gateway", "shard")  # name prefixes whose RSS must come back


def _pct(p: Percentiles) -> dict[str, Any]:
    return dataclasses.asdict(p)


def _latency(requests: Sequence[RequestLog]) -> dict[str, Any]:
    return {"ttft_ms": _pct(ttft_ms(requests)), "itl_ms": _pct(itl_ms(requests))}


def _generator(lags_s: Sequence[float]) -> dict[str, Any]:
    """How late the load generator's own loop ran (see loop_lag.py): its stamps are late by this."""
    return {
        "loop_lag_ms": _pct(percentiles(lags_s, 1000.0)),
        "max_loop_lag_ms": max(lags_s, default=0.0) * 1000.0,
    }


def _tenant_requests(spec: LoadSpec, recorder: Recorder, tenant: TenantSpec) -> dict[str, Any]:
    mine = [r for r in recorder.requests if r.tenant == tenant.name]
    gens = generations(mine)
    return {
        "sessions": spec.num_sessions_of(tenant.name),
        "chat_clients": spec.num_clients_of(tenant.name),
        "generation_requests": len(gens),
        "generation_ok": sum(r.ok for r in gens),
        "other_requests": len(mine) - len(gens),
        "other_ok": sum(r.ok for r in mine if not r.generates),
        "not_sent": recorder.not_sent.get(tenant.name, 0),
        "tokens": num_tokens(gens),
    }


def _rate_limited(spec: LoadSpec, recorder: Recorder) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tenant in spec.tenants:
        refusals = [r for r in recorder.refusals if r.tenant == tenant.name]
        out[tenant.name] = {
            "count": len(refusals),
            "with_retry_after": sum(r.retry_after_s is not None for r in refusals),
            "with_ratelimit_headers": sum(r.has_ratelimit_headers for r in refusals),
            "codes": dict(Counter(str(r.code) for r in refusals)),
            "reasons": dict(Counter(str(r.reason) for r in refusals)),
            "may_be_refused": spec.can_be_refused(tenant),
            "quota": {"rpm": tenant.rpm, "tpm": tenant.tpm, "max_concurrency": tenant.max_concurrency},
        }
    return out


def _admission(spec: LoadSpec, recorder: Recorder, gens: Sequence[RequestLog]) -> dict[str, Any]:
    """Admission by predicted wait: how many answers were 429 for the TTFT objective (of every
    attempt at a generation), and goodput, the tokens of requests whose first token came within
    the objective (TTFT from the attempt admitted) per second of the run, beside all tokens'."""
    objective = spec.ttft_objective_s
    refused = sum(r.reason == OBJECTIVE_REFUSAL for r in recorder.refusals)
    attempts = len(gens) + sum(r.num_refusals for r in gens)
    met = [r for r in gens if objective is not None and r.ttft_s is not None and r.ttft_s <= objective]
    stamps = [t for r in gens for t in r.token_stamps()]
    start = min((r.queued_at for r in gens), default=0.0)
    span = max(max(stamps, default=start) - start, 1e-9)
    return {
        "ttft_objective_s": objective,
        "refused": refused,
        "refused_share": refused / attempts if attempts else 0.0,
        "requests_within_objective": len(met) if objective is not None else None,
        "goodput_tokens_per_s": num_tokens(met) / span if objective is not None else None,
        "tokens_per_s": tokens_per_s(gens),
    }


def _fairness(spec: LoadSpec, recorder: Recorder, bucket_list: Sequence[Any]) -> dict[str, Any]:
    weights = {t.name: t.weight for t in spec.tenants}
    gens = generations(recorder.requests)
    num_buckets = len(bucket_list)
    rows = []
    generated = {share.tenant: share for share in busy_shares(bucket_list, weights)}
    for share in busy_shares(bucket_list, weights, computed=True):
        busy = busy_buckets(gens, share.tenant, spec.bucket_s, num_buckets, spec.queued_after_s)
        row = dataclasses.asdict(share)
        row["generated_tokens"] = generated[share.tenant].tokens
        row["generated_share"] = generated[share.tenant].share
        row["generated_deviation"] = generated[share.tenant].deviation
        row["weight"] = weights[share.tenant]
        row["busy_fraction"] = sum(busy) / num_buckets if num_buckets else 0.0
        row["within"] = share.within(SHARE_TOLERANCE)
        rows.append(row)
    window = outstanding_window(gens, list(weights))
    outstanding = window_shares(gens, weights, window) if window is not None else []
    return {
        "outstanding_window_s": window,
        "outstanding_shares": {share.tenant: share.share for share in outstanding},
        "definition": BUSY_DEFINITION,
        "bucket_s": spec.bucket_s,
        "num_buckets": num_buckets,
        "all_busy_buckets": sum(b.all_busy for b in bucket_list),
        "tolerance": SHARE_TOLERANCE,
        "tenants": rows,
    }


def _memory(rows: Sequence[MemoryRow]) -> dict[str, Any]:
    def mib(value: int | None) -> float | None:
        return None if value is None else round(value / MIB, 1)

    return {
        "tolerance": MEMORY_TOLERANCE,
        "processes": [
            {
                "name": row.name,
                "before_mib": mib(row.before_bytes),
                "working_set_mib": mib(row.working_bytes),
                "peak_mib": mib(row.peak_bytes),
                "after_mib": mib(row.after_bytes),
                "change": row.change,
                "growth": row.growth,
                "within": row.within,
            }
            for row in rows
        ],
    }


def build_report(
    spec: LoadSpec,
    recorder: Recorder,
    memory: Sequence[MemoryRow],
    *,
    target: Mapping[str, Any],
    generator_lags_s: Sequence[float] = (),
) -> dict[str, Any]:
    requests = recorder.requests
    gens = generations(requests)
    tenants = [t.name for t in spec.tenants]
    bucket_list = buckets(requests, tenants, spec.bucket_s, spec.queued_after_s)
    errors = Counter(r.error for r in requests if r.error is not None)
    report: dict[str, Any] = {
        "spec": dataclasses.asdict(spec),
        "target": dict(target),
        "duration_s": max((r.ended_at or 0.0 for r in requests), default=0.0),
        "requests": {t.name: _tenant_requests(spec, recorder, t) for t in spec.tenants},
        "tokens": {"total": num_tokens(gens), "tokens_per_s": tokens_per_s(gens)},
        "latency": {
            "overall": _latency(gens),
            "by_tenant": {t: _latency(generations(gens, t)) for t in tenants},
        },
        "errors": {
            "by_kind": dict(errors),
            "by_class": dict(Counter(error_class(kind) for kind in errors.elements())),
        },
        "rate_limited": _rate_limited(spec, recorder),
        "admission": _admission(spec, recorder, gens),
        "fairness": _fairness(spec, recorder, bucket_list),
        "memory": _memory(memory),
        "generator": _generator(generator_lags_s),
        "buckets": [dataclasses.asdict(b) for b in bucket_list],
    }
    report["checks"] = checks(report)
    report["passed"] = all(c["result"] != "fail" for c in report["checks"])
    return report


def _check(name: str, ok: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "result": "skipped" if ok is None else "pass" if ok else "fail", "detail": detail}


def checks(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The load test's acceptance checks, judged on a built report."""
    return [*_error_checks(report), _quota_check(report), _share_check(report), _memory_check(report)]


def _error_checks(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    by_class = report["errors"]["by_class"]
    failures = {c: by_class.get(c, 0) for c in FAILURE_CLASSES}
    other = {k: n for k, n in report["errors"]["by_kind"].items() if error_class(k) not in FAILURE_CLASSES}
    not_sent = sum(t["not_sent"] for t in report["requests"].values())
    return [
        _check("0 requests lost, hung or 5xx", not any(failures.values()), counts(failures) or "none"),
        _check(
            "no other error, no turn left unsent",
            not other and not not_sent,
            f"{counts(other) or 'no other errors'}; {not_sent} not sent",
        ),
    ]


def _quota_check(report: Mapping[str, Any]) -> dict[str, Any]:
    """A 429 for a quota only where a tenant's quota is below its demand; with a TTFT objective,
    any tenant may also be refused for it (the predicted wait), each with Retry-After."""
    limited = report["rate_limited"].values()
    has_objective = (report.get("admission") or {}).get("ttft_objective_s") is not None

    def for_quota(v: Mapping[str, Any]) -> int:
        return int(v["count"]) - (v.get("reasons", {}).get(OBJECTIVE_REFUSAL, 0) if has_objective else 0)

    wrong_tenant = {
        t: n for t, v in report["rate_limited"].items() if (n := for_quota(v)) and not v["may_be_refused"]
    }
    no_retry_after = sum(v["count"] - v["with_retry_after"] for v in limited)
    wrong_code = sum(n for v in limited for code, n in v["codes"].items() if code != "rate_limit_exceeded")
    return _check(
        "429 only for tenants over their own quota (or the TTFT objective), each with Retry-After",
        not wrong_tenant and not no_retry_after and not wrong_code,
        f"{sum(v['count'] for v in limited)} 429s; {no_retry_after} without Retry-After; "
        f"{wrong_code} with another code; tenants that should never be refused: "
        f"{counts(wrong_tenant) or 'none refused'}",
    )


def _share_check(report: Mapping[str, Any]) -> dict[str, Any]:
    fairness = report["fairness"]
    shares = ", ".join(
        f"{row['tenant']} {percent(row['share'])} of computed tokens vs "
        f"{percent(row['weight_share'])} by weight"
        for row in fairness["tenants"]
    )
    name = f"computed-token share within ±{SHARE_TOLERANCE:.0%} of weight share while every tenant is busy"
    busy_s = fairness["all_busy_buckets"] * fairness["bucket_s"]
    detail = f"{fairness['all_busy_buckets']} of {fairness['num_buckets']} buckets all busy; {shares}"
    if report["admission"]["ttft_objective_s"] is not None and busy_s < MIN_JUDGED_BUSY_S_WITH_OBJECTIVE:
        return _check(
            name,
            None,
            f"too few seconds to judge under admission (at least "
            f"{MIN_JUDGED_BUSY_S_WITH_OBJECTIVE} needed): {detail}",
        )
    ok = fairness["all_busy_buckets"] > 0 and all(row["within"] for row in fairness["tenants"])
    return _check(name, ok, detail)


def _memory_check(report: Mapping[str, Any]) -> dict[str, Any]:
    rows = [p for p in report["memory"]["processes"] if p["name"].startswith(CHECKED_PROCESSES)]
    ok = None if not rows or any(p["within"] is None for p in rows) else all(p["within"] for p in rows)
    detail = (
        ", ".join(
            f"{p['name']} {signed(p['growth'])} (since before the load {signed(p['change'])})" for p in rows
        )
        or "no RSS taken"
    )
    return _check(
        f"gateway and shard RSS after the run within {MEMORY_TOLERANCE:.0%} of their working set", ok, detail
    )


def counts(values: Mapping[str, int]) -> str:
    """`a 1, b 2` of the non-zero counts."""
    return ", ".join(f"{k} {v}" for k, v in values.items() if v)


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"
