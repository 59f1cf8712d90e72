"""The run's PNG, from its report: latency percentiles per time bucket above, tokens/s by tenant below.

The top panel draws TTFT (solid) and ITL (dashed) p50, p95 and p99 of each bucket on a log scale;
the bottom one each tenant's tokens/s per bucket, with the buckets where every tenant was busy
(where shares are measured) shaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

QUANTILE_COLOURS = {"p50": "tab:blue", "p95": "tab:orange", "p99": "tab:red"}


def _series(buckets: list[dict[str, Any]], metric: str, quantile: str) -> list[float]:
    return [b[metric][quantile] if b[metric][quantile] is not None else float("nan") for b in buckets]


def write_png(report: Mapping[str, Any], path: Path) -> None:
    buckets = report["buckets"]
    width = report["fairness"]["bucket_s"]
    times = [b["start_s"] + width / 2 for b in buckets]
    tenants = list(report["requests"])
    figure, (latency, throughput) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for quantile, colour in QUANTILE_COLOURS.items():
        latency.plot(times, _series(buckets, "ttft_ms", quantile), color=colour, label=f"TTFT {quantile}")
        latency.plot(
            times, _series(buckets, "itl_ms", quantile), color=colour, linestyle="--", label=f"ITL {quantile}"
        )
    latency.set_yscale("log")
    latency.set_ylabel("ms (log)")
    latency.set_title("time to first token and inter-token latency, per time bucket")
    latency.legend(ncol=3, fontsize="small")
    latency.grid(True, which="both", alpha=0.3)
    for tenant in tenants:
        rates = [b["tokens"].get(tenant, 0) / width for b in buckets]
        throughput.plot(times, rates, label=tenant)
    for b in buckets:
        if b["all_busy"]:
            throughput.axvspan(b["start_s"], b["start_s"] + width, color="grey", alpha=0.15, linewidth=0)
    throughput.set_ylabel("tokens/s")
    throughput.set_xlabel("seconds since the start")
    throughput.set_title("tokens/s by tenant (shaded: every tenant busy)")
    throughput.legend(fontsize="small")
    throughput.grid(True, alpha=0.3)
    spec = report["spec"]
    figure.suptitle(
        f"{spec['num_sessions']} sessions, {spec['num_chat_clients']} chat clients, "
        f"{report['tokens']['tokens_per_s']:.0f} tokens/s aggregate"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
