"""The numbers of a run: latency percentiles, per-second buckets, when every tenant was busy, shares.

Design. Time to first token (TTFT) is measured from the attempt that was answered (after any 429
waits) to the first chunk with text; inter-token latency (ITL) is the gap between consecutive text
chunks of one stream. Percentiles are numpy's (linear interpolation). Tokens are counted where
they arrived (`RequestLog.token_stamps`), in buckets of `width_s` from the run's start.

Weighted fair queuing promises each tenant its weight's share only while it is backlogged, so the
shares are measured only over the buckets in which every tenant was busy, and "busy" means
backlogged as a client can see it: for the whole bucket the tenant had at least one generation
request that had been waiting for its first token for longer than `queued_after_s` (sent that
long ago and not yet answered with a token). Such a request is queued at stage 0, where fair
share chooses, and not merely in its own prefill, which takes a step or two: a tenant whose few
requests are each admitted at once asks for less than its share, and weighted fair queuing gives
the rest to the others, as it should. A tenant waiting out a 429, or whose every request is
already streaming, is not busy.
Each tenant's share is its tokens over all tenants' tokens in those buckets, against its weight
over the sum of the weights; `deviation` is share / weight share - 1. The tokens counted are the
ones the pipeline computed for the tenant, the unit stage 0's fair share divides: the prompt
tokens the prefix cache did not serve (placed at the first token, where the prefill ends) and the
generated ones. Shares of generated tokens alone are reported beside them: with every answer 16
tokens long, a tenant whose prompts cost more prefill (a second turn the cache no longer holds)
gets fewer generated tokens for the same computed share. The report also gives the
shares over the plainer window "while every tenant still had requests outstanding"
(`outstanding_window`: queued, waiting out a 429 or streaming), which counts a tenant that only
waits on its quota as present.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from loadtest.measure import RequestLog

QUANTILES = (50, 95, 99)


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50: float | None
    p95: float | None
    p99: float | None


def percentiles(values: Sequence[float], scale: float = 1.0) -> Percentiles:
    """p50, p95 and p99 of `values` times `scale` (1000: seconds to ms); None for none."""
    if not values:
        return Percentiles(0, None, None, None)
    p50, p95, p99 = (float(v) * scale for v in np.percentile(np.asarray(values, dtype=float), QUANTILES))
    return Percentiles(len(values), p50, p95, p99)


def generations(requests: Iterable[RequestLog], tenant: str | None = None) -> list[RequestLog]:
    return [r for r in requests if r.generates and (tenant is None or r.tenant == tenant)]


def ttft_ms(requests: Iterable[RequestLog]) -> Percentiles:
    return percentiles([t for r in requests if (t := r.ttft_s) is not None], 1000.0)


def itl_ms(requests: Iterable[RequestLog]) -> Percentiles:
    return percentiles([gap for r in requests for _, gap in r.gaps()], 1000.0)


def num_tokens(requests: Iterable[RequestLog]) -> int:
    return sum(len(r.token_stamps()) for r in requests)


def tokens_per_s(requests: Sequence[RequestLog]) -> float:
    """All tokens over the time from the first request sent to the last token."""
    stamps = [t for r in requests for t in r.token_stamps()]
    if not stamps:
        return 0.0
    start = min(r.queued_at for r in requests)
    return len(stamps) / max(max(stamps) - start, 1e-9)


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def waiting_intervals(
    requests: Iterable[RequestLog], queued_after_s: float = 0.0
) -> list[tuple[float, float]]:
    """When a request had been waiting for its first token for over `queued_after_s`, merged:
    [sent + queued_after_s, first token or end)."""
    spans = []
    for r in requests:
        end = r.first_token_at if r.first_token_at is not None else r.ended_at
        if end is not None:
            spans.append((r.sent_at + queued_after_s, end))
    return _merged(spans)


def busy_buckets(
    requests: Sequence[RequestLog], tenant: str, width_s: float, num_buckets: int, queued_after_s: float = 0.0
) -> list[bool]:
    """Whether `tenant` was busy (see the module's design) for the whole of each bucket."""
    busy = [False] * num_buckets
    for start, end in waiting_intervals(generations(requests, tenant), queued_after_s):
        first = math.ceil(start / width_s - 1e-9)
        last = math.floor(end / width_s + 1e-9)  # buckets [first, last) lie wholly inside
        for index in range(max(0, first), min(num_buckets, last)):
            busy[index] = True
    return busy


@dataclass(frozen=True)
class Share:
    tenant: str
    tokens: int
    share: float | None
    weight_share: float
    deviation: float | None  # share / weight_share - 1

    def within(self, tolerance: float) -> bool:
        return self.deviation is not None and abs(self.deviation) <= tolerance


def shares(tokens_by_tenant: Mapping[str, int], weights: Mapping[str, float]) -> list[Share]:
    """Each tenant's share of `tokens_by_tenant` against its share of `weights`."""
    total_tokens = sum(tokens_by_tenant.get(t, 0) for t in weights)
    total_weight = sum(weights.values())
    rows = []
    for tenant, weight in weights.items():
        tokens = tokens_by_tenant.get(tenant, 0)
        weight_share = weight / total_weight
        share = tokens / total_tokens if total_tokens else None
        deviation = None if share is None else share / weight_share - 1.0
        rows.append(Share(tenant, tokens, share, weight_share, deviation))
    return rows


@dataclass(frozen=True)
class Bucket:
    start_s: float
    tokens: dict[str, int]  # generated tokens, by tenant
    computed: dict[str, int]  # tokens computed (prompt tokens not cached + generated), by tenant
    ttft_ms: Percentiles  # of requests whose first token arrived in the bucket
    itl_ms: Percentiles  # of gaps that ended in the bucket
    all_busy: bool


def buckets(
    requests: Sequence[RequestLog], tenants: Sequence[str], width_s: float, queued_after_s: float = 0.0
) -> list[Bucket]:
    """The run in buckets of `width_s` from 0 to the last token."""
    gens = generations(requests)
    stamps = [t for r in gens for t in r.token_stamps()]
    if not stamps:
        return []
    num_buckets = int(max(stamps) // width_s) + 1
    tokens = [dict.fromkeys(tenants, 0) for _ in range(num_buckets)]
    computed = [dict.fromkeys(tenants, 0) for _ in range(num_buckets)]
    ttfts: list[list[float]] = [[] for _ in range(num_buckets)]
    gaps: list[list[float]] = [[] for _ in range(num_buckets)]
    for r in gens:
        for t in r.token_stamps():
            bucket = tokens[int(t // width_s)]
            bucket[r.tenant] = bucket.get(r.tenant, 0) + 1
        for t in r.computed_stamps():
            bucket = computed[int(t // width_s)]
            bucket[r.tenant] = bucket.get(r.tenant, 0) + 1
        if r.first_token_at is not None and r.ttft_s is not None:
            ttfts[int(r.first_token_at // width_s)].append(r.ttft_s)
        for at, gap in r.gaps():
            gaps[int(at // width_s)].append(gap)
    busy = [busy_buckets(gens, t, width_s, num_buckets, queued_after_s) for t in tenants]
    return [
        Bucket(
            start_s=i * width_s,
            tokens=tokens[i],
            computed=computed[i],
            ttft_ms=percentiles(ttfts[i], 1000.0),
            itl_ms=percentiles(gaps[i], 1000.0),
            all_busy=all(b[i] for b in busy),
        )
        for i in range(num_buckets)
    ]


def outstanding_window(requests: Sequence[RequestLog], tenants: Sequence[str]) -> tuple[float, float] | None:
    """From the moment the last tenant queued its first generation request to the moment the first
    tenant's last one ended: while every tenant still had requests outstanding (None if never)."""
    spans = []
    for tenant in tenants:
        mine = generations(requests, tenant)
        if not mine:
            return None
        spans.append((min(r.queued_at for r in mine), max(r.ended_at or r.queued_at for r in mine)))
    start, end = max(s for s, _ in spans), min(e for _, e in spans)
    return (start, end) if end > start else None


def window_shares(
    requests: Sequence[RequestLog], weights: Mapping[str, float], window: tuple[float, float]
) -> list[Share]:
    """The tenants' shares of the tokens that arrived within `window`."""
    start, end = window
    totals = dict.fromkeys(weights, 0)
    for r in generations(requests):
        if r.tenant in totals:
            totals[r.tenant] += sum(1 for t in r.token_stamps() if start <= t < end)
    return shares(totals, weights)


def busy_shares(
    bucket_list: Sequence[Bucket], weights: Mapping[str, float], *, computed: bool = False
) -> list[Share]:
    """The tenants' shares of the tokens that arrived in the buckets where every tenant was busy:
    generated tokens, or with `computed` the tokens the pipeline computed (what fair share counts)."""
    totals = dict.fromkeys(weights, 0)
    for bucket in bucket_list:
        if bucket.all_busy:
            counts = bucket.computed if computed else bucket.tokens
            for tenant in totals:
                totals[tenant] += counts.get(tenant, 0)
    return shares(totals, weights)
