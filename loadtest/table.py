"""A report as people read it: a markdown table by tenant, one of memory, one of the checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.report import counts, percent, signed


def markdown(report: Mapping[str, Any]) -> str:
    lines = [_headline(report), "", *_tenant_table(report), "", *_memory_table(report), ""]
    lines += ["| check | result | figures |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['result']} | {c['detail']} |" for c in report["checks"]]
    lines += ["", f"errors by kind: {counts(report['errors']['by_kind']) or 'none'}"]
    return "\n".join(lines) + "\n"


def _headline(report: Mapping[str, Any]) -> str:
    spec, tokens = report["spec"], report["tokens"]
    line = (
        f"{spec['num_sessions']} sessions × {spec['turns_per_session']} turns and "
        f"{spec['num_chat_clients']} chat clients × {spec['chat_requests_per_client']} requests, "
        f"{spec['tokens_per_turn']} tokens each; {report['duration_s']:.1f} s; "
        f"{tokens['total']} tokens, {tokens['tokens_per_s']:.1f} tokens/s aggregate"
    )
    admission = report.get("admission") or {}
    objective = admission.get("ttft_objective_s")
    if objective is None:
        return line + "; no TTFT objective (every request queued)"
    return line + (
        f"; TTFT objective {objective:g} s: {admission['refused']} answers 429 for it "
        f"({percent(admission['refused_share'])} of attempts), goodput "
        f"{admission['goodput_tokens_per_s']:.1f} tokens/s (tokens of the "
        f"{admission['requests_within_objective']} requests within it)"
    )


def _row(label: str, overall: str, values: Sequence[str]) -> str:
    return "| " + " | ".join([label, overall, *values]) + " |"


def _ms(p: Mapping[str, Any]) -> str:
    return "–" if p["count"] == 0 else " / ".join(f"{p[q]:.0f}" for q in ("p50", "p95", "p99"))


def _quota(quota: Mapping[str, int | None]) -> str:
    return ", ".join(f"{name} {value}" for name, value in quota.items() if value is not None) or "none"


def _window(window: Sequence[float] | None) -> str:
    return "none" if window is None else f"{window[0]:.0f}–{window[1]:.0f} s"


def _tenant_table(report: Mapping[str, Any]) -> list[str]:
    requests, limited, latency = report["requests"], report["rate_limited"], report["latency"]
    tenants = list(requests)
    fairness = report["fairness"]
    share = {row["tenant"]: row for row in fairness["tenants"]}
    ok, sent = (sum(t[k] for t in requests.values()) for k in ("generation_ok", "generation_requests"))
    num_429, num_with = (sum(v[k] for v in limited.values()) for k in ("count", "with_retry_after"))
    weights = [f"{share[t]['weight']:g} ({percent(share[t]['weight_share'])})" for t in tenants]
    return [
        _row("", "all", tenants),
        _row("---", "---", ["---"] * len(tenants)),
        _row("weight (share)", "–", weights),
        _row("quota", "–", [_quota(limited[t]["quota"]) for t in tenants]),
        _row(
            "generation requests ok / sent",
            f"{ok} / {sent}",
            [f"{requests[t]['generation_ok']} / {requests[t]['generation_requests']}" for t in tenants],
        ),
        _row("tokens", str(report["tokens"]["total"]), [str(requests[t]["tokens"]) for t in tenants]),
        *(
            _row(
                f"{name} p50 / p95 / p99, ms",
                _ms(latency["overall"][key]),
                [_ms(latency["by_tenant"][t][key]) for t in tenants],
            )
            for name, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"))
        ),
        _row(
            "load generator's loop lag p50 / p95 / p99, ms",
            _ms(report["generator"]["loop_lag_ms"]),
            ["–"] * len(tenants),
        ),
        _row(
            "429s (with Retry-After)",
            f"{num_429} ({num_with})",
            [f"{limited[t]['count']} ({limited[t]['with_retry_after']})" for t in tenants],
        ),
        _row(
            "of which for the TTFT objective",
            str(sum(v.get("reasons", {}).get("ttft_objective", 0) for v in limited.values())),
            [str(limited[t].get("reasons", {}).get("ttft_objective", 0)) for t in tenants],
        ),
        _row(
            "computed-token share while all busy (vs weight share)",
            f"{fairness['all_busy_buckets']} of {fairness['num_buckets']} s",
            [f"{percent(share[t]['share'])} ({signed(share[t]['deviation'])})" for t in tenants],
        ),
        _row(
            "generated-token share while all busy",
            "–",
            [
                f"{percent(share[t].get('generated_share'))} ({signed(share[t].get('generated_deviation'))})"
                for t in tenants
            ],
        ),
        _row("busy, fraction of the run", "–", [percent(share[t]["busy_fraction"]) for t in tenants]),
        _row(
            "token share while all had requests outstanding",
            _window(fairness["outstanding_window_s"]),
            [percent(fairness["outstanding_shares"].get(t)) for t in tenants],
        ),
    ]


def memory_table(report: Mapping[str, Any]) -> str:
    """The report's memory rows alone, as markdown."""
    return "\n".join(_memory_table(report)) + "\n"


def _memory_table(report: Mapping[str, Any]) -> list[str]:
    lines = [
        "| process | RSS before, MiB | working set, MiB | peak, MiB | after, MiB | after vs before "
        "| after vs working set | within 10% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report["memory"]["processes"]:
        within = "–" if p["within"] is None else "yes" if p["within"] else "no"
        sizes = [
            "–" if p[k] is None else str(p[k])
            for k in ("before_mib", "working_set_mib", "peak_mib", "after_mib")
        ]
        changes = [signed(p["change"]), signed(p["growth"])]
        lines.append("| " + " | ".join([p["name"], *sizes, *changes, within]) + " |")
    return lines
