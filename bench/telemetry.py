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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

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


SERVICE_CPU: list[float] = []  # the telemetry service's CPU seconds per second of load, per round

SHORT = Form(rounds=1, repeats=2, tokens=16)
FULL = Form(rounds=2, repeats=3, tokens=48)


_SCRAPE_LOOP = """
import sys, time, urllib.request
url, scrapes = sys.argv[1], 0
while True:
    time.sleep(1.0)
    with urllib.request.urlopen(url, timeout=5) as response:
        response.read()
    scrapes += 1
    print(scrapes, flush=True)
"""


class Scraper:
    """GET /metrics every second from a process of its own, as Prometheus would, while the load
    runs (a thread in this process would take the GIL from the streams' client)."""

    def __init__(self, url: str) -> None:
        self.url, self.num_scrapes = url, 0
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Scraper:
        command = [sys.executable, "-c", _SCRAPE_LOOP, f"{self.url}/metrics"]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        out, _ = self._process.communicate(timeout=10)
        self.num_scrapes = len(out.split())


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
            service = psutil.Process(setup.cluster.processes["telemetry"].pid)
            cpu_before, started = sum(service.cpu_times()[:2]), time.monotonic()
            with Scraper(url) as scraper:
                runs = [setup.concurrent(qs, form.tokens) for _ in range(form.repeats)]
            SERVICE_CPU.append((sum(service.cpu_times()[:2]) - cpu_before) / (time.monotonic() - started))
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
    shares = ", ".join(f"{100 * c:.1f}%" for c in SERVICE_CPU)
    print(f"the telemetry service's own CPU during the load: {shares} of one core (per round)")
    result["service_cpu"] = SERVICE_CPU
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        plain = {k: getattr(v, "__dict__", v) for k, v in result.items()}
        args.json.write_text(json.dumps({"form": form.__dict__, "results": plain}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
