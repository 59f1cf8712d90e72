"""Telemetry's cost: 32-stream throughput with the telemetry service and every report on, and off.

"On" is what `mohawk up` runs: shard nodes publish a step report every heartbeat interval, the
gateway a request report every second, and the telemetry service consumes them and serves /metrics,
which this benchmark scrapes every second as Prometheus would. "Off" is the same cluster with
`MOHAWK_TELEMETRY=false` and no telemetry service. Each round starts one cluster of each kind in
turn (3 one-thread shard nodes, the bundled model), warms it up and measures aggregate output
tokens/s of 32 concurrent greedy streams through the gateway, --repeats times. The report gives
medians with min–max and the ratio on/off; the issue's bar is a cost of at most 2%.
`python bench/telemetry.py` is the short form, `--full` the long one (`make bench`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributed import ClusterSetup, questions
from engine import Stat

from mohawk_common.logging import configure_logging


@dataclass(frozen=True)
class Form:
    rounds: int
    repeats: int
    tokens: int
    num_concurrent: int = 32


SHORT = Form(rounds=1, repeats=2, tokens=16)
FULL = Form(rounds=2, repeats=3, tokens=48)


class Scraper:
    """GET /metrics every second, as Prometheus would, while the load runs."""

    def __init__(self, url: str) -> None:
        self.url, self.num_scrapes = url, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                httpx.get(f"{self.url}/metrics", timeout=5).raise_for_status()
                self.num_scrapes += 1
            except httpx.HTTPError:
                pass

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def measure(telemetry: bool, form: Form) -> list[float]:
    qs = questions(form.num_concurrent)
    env = {"MOHAWK_WEIGHTS": "native"} | ({} if telemetry else {"MOHAWK_TELEMETRY": "false"})
    with tempfile.TemporaryDirectory(prefix="mohawk-telemetry-bench-") as data_dir:
        setup = ClusterSetup(3, Path(data_dir), threads_per_node=1, env=env, telemetry=telemetry)
        try:
            setup.concurrent(qs[:4], 4)  # warm-up
            url = setup.cluster.telemetry_url
            if url is None:
                return [setup.concurrent(qs, form.tokens) for _ in range(form.repeats)]
            with Scraper(url) as scraper:
                runs = [setup.concurrent(qs, form.tokens) for _ in range(form.repeats)]
            if scraper.num_scrapes == 0:
                raise RuntimeError("the telemetry service answered no scrape")
            return runs
        finally:
            setup.close()


def run(form: Form) -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    for _ in range(form.rounds):
        off += measure(False, form)
        on += measure(True, form)
    off_stat, on_stat = Stat.of(off), Stat.of(on)
    return {"off": off_stat, "on": on_stat, "ratio": on_stat.median / off_stat.median}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    configure_logging("warning")
    form = FULL if args.full else SHORT
    result = run(form)
    runs = form.rounds * form.repeats
    print(
        f"{form.num_concurrent} streams × {form.tokens} tokens, greedy, 3 one-thread nodes; "
        f"medians (min–max) of {runs} runs"
    )
    print()
    print(f"| telemetry | {form.num_concurrent}-stream aggregate tok/s |")
    print("|---|---|")
    print(f"| off (MOHAWK_TELEMETRY=false, no service) | {result['off']} |")
    print(f"| on (reports, service, a scrape a second) | {result['on']} |")
    print()
    print(f"on / off: {result['ratio']:.3f} (cost {100 * (1 - result['ratio']):.1f}%)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        plain = {k: getattr(v, "__dict__", v) for k, v in result.items()}
        args.json.write_text(json.dumps({"form": form.__dict__, "results": plain}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
