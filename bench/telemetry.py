"""Telemetry's cost: 32-stream throughput with the telemetry service and every report on, and off.

"On" is what `mohawk up` runs: shard nodes publish a step report every heartbeat interval, the
gateway a request report every second, and the telemetry service consumes them and serves /metrics,
which this benchmark scrapes every second as Prometheus would. "Off" is the same cluster with
`MOHAWK_TELEMETRY=false` and no telemetry service. Each round starts one cluster of each kind in
turn (3 one-thread shard nodes, the bundled model), warms it up and measures aggregate output
tokens/s of 32 concurrent greedy streams through the gateway, --repeats times. The report gives
medians with min–max and the ratio on/off; the bar is a cost of at most 2%. `--traces`
adds a third kind: telemetry on and every gateway and shard node exporting its spans over OTLP
(`OTEL_EXPORTER_OTLP_ENDPOINT`) to a sink process that reads and drops them, as a collector would.
`python bench/telemetry.py` is the short form, `--full` the long one (`make bench`).
"""

from __future__ import annotations

import argparse
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
from results_file import write_results

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

_OTLP_SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        print(1, flush=True)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class _EventCountingChild:
    """A `python -c` helper in a process of its own that prints a line per event; on exit it is
    stopped and `num_events` counts the lines it printed after those `__enter__` read."""

    def __init__(self, code: str, *args: str) -> None:
        self._command = [sys.executable, "-c", code, *args]
        self._process: subprocess.Popen[str] | None = None
        self.num_events = 0

    def _start(self) -> subprocess.Popen[str]:
        self._process = subprocess.Popen(self._command, stdout=subprocess.PIPE, text=True)
        return self._process

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        out, _ = self._process.communicate(timeout=10)
        self.num_events = len(out.split())


class OtlpSink(_EventCountingChild):
    """An OTLP/HTTP endpoint that reads every export and drops it; an event is an export."""

    def __init__(self) -> None:
        super().__init__(_OTLP_SINK)
        self.endpoint = ""

    def __enter__(self) -> OtlpSink:
        stdout = self._start().stdout
        assert stdout is not None
        self.endpoint = f"http://127.0.0.1:{int(stdout.readline())}"
        return self


class Scraper(_EventCountingChild):
    """GET /metrics every second, as Prometheus would, while the load runs (from a process of its
    own: a thread in this process would take the GIL from the streams' client); an event is a scrape."""

    def __init__(self, url: str) -> None:
        super().__init__(_SCRAPE_LOOP, f"{url}/metrics")

    def __enter__(self) -> Scraper:
        self._start()
        return self


def measure(telemetry: bool, form: Form, otlp_endpoint: str = "") -> list[float]:
    qs = questions(form.num_concurrent)
    env = {"MOHAWK_WEIGHTS": "native"} | ({} if telemetry else {"MOHAWK_TELEMETRY": "false"})
    if otlp_endpoint:
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint}
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
            if scraper.num_events == 0:
                raise RuntimeError("the telemetry service answered no scrape")
            return runs
        finally:
            setup.close()


def run(form: Form, traces: bool) -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    traced: list[float] = []
    exports = 0
    for _ in range(form.rounds):
        off += measure(False, form)
        on += measure(True, form)
        if traces:
            with OtlpSink() as sink:
                traced += measure(True, form, sink.endpoint)
            exports += sink.num_events
            if sink.num_events == 0:
                raise RuntimeError("no process exported a span to the OTLP sink")
    off_stat, on_stat = Stat.of(off), Stat.of(on)
    result: dict[str, Any] = {"off": off_stat, "on": on_stat, "ratio": on_stat.median / off_stat.median}
    if traces:
        traced_stat = Stat.of(traced)
        result |= {"traces": traced_stat, "traces_ratio": traced_stat.median / off_stat.median}
        result["otlp_exports"] = exports
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full form (make bench)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--traces", action="store_true", help="also measure with OTLP traces exported")
    parser.add_argument("--rounds", type=int, help="rounds of each kind (the form's by default)")
    args = parser.parse_args(argv)
    configure_logging("warning")
    form = FULL if args.full else SHORT
    if args.rounds:
        form = Form(rounds=args.rounds, repeats=form.repeats, tokens=form.tokens)
    result = run(form, args.traces)
    runs = form.rounds * form.repeats
    lines = [
        f"{form.num_concurrent} streams × {form.tokens} tokens, greedy, 3 one-thread nodes; "
        f"medians (min–max) of {runs} runs",
        "",
        f"| telemetry | {form.num_concurrent}-stream aggregate tok/s |",
        "|---|---|",
        f"| off (MOHAWK_TELEMETRY=false, no service) | {result['off']} |",
        f"| on (reports, service, a scrape a second) | {result['on']} |",
    ]
    if args.traces:
        lines.append(f"| on, and traces exported over OTLP | {result['traces']} |")
    lines += ["", f"on / off: {result['ratio']:.3f} (cost {100 * (1 - result['ratio']):.1f}%)"]
    if args.traces:
        ratio = result["traces_ratio"]
        lines.append(f"on with traces / off: {ratio:.3f} (cost {100 * (1 - ratio):.1f}%)")
        lines.append(f"OTLP exports received by the sink: {result['otlp_exports']}")
    shares = ", ".join(f"{100 * c:.1f}%" for c in SERVICE_CPU)
    lines.append(f"the telemetry service's own CPU during the load: {shares} of one core (per round)")
    print("\n".join(lines))
    result["service_cpu"] = SERVICE_CPU
    if args.json:
        plain = {k: getattr(v, "__dict__", v) for k, v in result.items()}
        write_results(args.json, {"form": form.__dict__, "results": plain}, lines, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
