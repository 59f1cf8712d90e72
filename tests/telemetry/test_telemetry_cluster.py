"""The telemetry service on a real 3-stage cluster (`mohawk up`'s processes): one scrape of its
/metrics during a generation shows each stage's busy share, tokens/s and KV use labelled by node
and stage; the gateway's request reports fill the latency histograms; the dashboard, in a real
headless Chromium, lists the nodes and shows tokens/s rising above 0, live; and the processes'
OTLP exports (to a receiver in this test) give one request one connected trace, gateway → stage 0
→ stage 1 → stage 2 → gateway, with the hop times as span attributes."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mohawk_cli.cluster import ClusterSpec, LocalCluster
from mohawk_common.bus.server import free_port
from tests.integration.cluster_helpers import PROMPTS, stream_many
from tests.telemetry.browser import launch_chromium
from tests.telemetry.otlp_receiver import OtlpReceiver, ReceivedSpan

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver) -> Iterator[LocalCluster]:
    tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    spec = ClusterSpec(
        nodes=3,
        port=free_port(),
        nats_port=free_port(),
        data_dir=tmp_path_factory.mktemp("telemetry"),
        threads_per_node=1,
        env={"MOHAWK_PLACEMENT": "spread", **tracing},
        telemetry=True,
        telemetry_port=free_port(),
    )
    with LocalCluster(spec) as running:
        running.wait_ready(timeout=240)
        yield running


class Generation:
    """Greedy streams in a background thread, one batch after another, until stopped."""

    def __init__(self, base_url: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base_url,), daemon=True)

    def _run(self, base_url: str) -> None:
        while not self._stop.is_set():
            stream_many(base_url, PROMPTS, 48)

    def __enter__(self) -> Generation:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


def by_stage(samples: list[tuple[dict[str, str], float]]) -> dict[tuple[str, str], float]:
    return {(labels["node"], labels["stage"]): value for labels, value in samples}


def test_one_scrape_during_a_generation_shows_every_stage(cluster: LocalCluster) -> None:
    assert cluster.telemetry_url is not None
    with Generation(cluster.url):
        deadline, busy = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            metrics = scrape(cluster.telemetry_url)
            busy = by_stage(metrics.get("mohawk_stage_busy_share", []))
            tokens = by_stage(metrics.get("mohawk_stage_tokens_per_second", []))
            kv = by_stage(metrics.get("mohawk_kv_blocks_used", []))
            if len(busy) == 3 and all(busy.values()) and all(tokens.values()) and all(kv.values()):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no scrape showed all three stages at work: {busy}")
    assert sorted(stage for _, stage in busy) == ["0", "1", "2"]
    assert all(0 < share <= 1 for share in busy.values())
    labels = metrics["mohawk_stage_busy_share"][0][0]
    assert labels["runtime"] == "torch" and labels["device"] == "cpu" and labels["model"] and labels["quant"]
    pipeline = metrics["mohawk_pipeline_tokens_per_second"]
    assert pipeline and pipeline[0][1] > 0
    # the gateway's request reports: finished requests reached the latency histograms
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = scrape(cluster.telemetry_url)
        counts = [
            v
            for labels, v in metrics.get("mohawk_time_to_first_token_seconds", [])
            if labels.get("le") == "+Inf"
        ]
        if counts and sum(counts) > 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("no request reached the time-to-first-token histogram")
    outcomes = {labels["outcome"] for labels, v in metrics["mohawk_requests"] if v > 0}
    assert outcomes == {"ok"}
    assert {labels["node"] for labels, v in metrics["mohawk_node_up"] if v == 1} == {
        "shard-1",
        "shard-2",
        "shard-3",
    }


def test_the_dashboard_shows_the_nodes_and_live_tokens_per_second(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert cluster.telemetry_url is not None
    with launch_chromium() as browser, Generation(cluster.url):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        outside: list[str] = []
        page.on(
            "request", lambda request: outside.append(request.url) if "127.0.0.1" not in request.url else None
        )
        page.goto(cluster.telemetry_url + "/")
        page.wait_for_function(
            "document.querySelector('#connection')?.textContent.trim() === 'live'", timeout=30_000
        )
        page.wait_for_function(
            "document.querySelectorAll('#nodes .node[data-node-id]').length >= 3", timeout=30_000
        )
        page.wait_for_function(
            "parseFloat(document.querySelector('#tokens-per-s').textContent) > 0", timeout=90_000
        )
        time.sleep(3)  # a few more seconds of the charts
        nodes = page.eval_on_selector_all(
            "#nodes .node[data-node-id]", "els => els.map(e => e.dataset.nodeId)"
        )
        assert set(nodes) == {"shard-1", "shard-2", "shard-3"}
        assert page.inner_text("#plan-version").strip() not in ("", "—")
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not outside, outside  # no CDN: everything came from the service
    if os.environ.get("MOHAWK_UPDATE_SCREENSHOT"):  # docs/operations.md shows docs/dashboard.png
        shutil.copyfile(shot, SCREENSHOT)


def test_one_request_gives_one_connected_trace_across_the_processes(
    cluster: LocalCluster, otlp: OtlpReceiver
) -> None:
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    response = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        json={
            "model": cluster.served_model,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 6,
            "temperature": 0,
        },
        headers={"traceparent": f"00-{client_trace}-{client_span}-01"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    request_id, tokens = response.json()["id"], response.json()["usage"]["completion_tokens"]
    names = {
        "mohawk.gateway chat",
        "mohawk.stage 0",
        "mohawk.stage 1",
        "mohawk.stage 2",
        "mohawk.gateway tokens",
    }
    deadline, found = time.monotonic() + 30, {}
    while time.monotonic() < deadline:
        found = {s.name: s for s in otlp.spans() if s.trace_id == client_trace}
        if names <= set(found):
            break
        time.sleep(0.3)
    assert names <= set(found), sorted(found)
    chain = [
        found[n]
        for n in [
            "mohawk.gateway chat",
            "mohawk.stage 0",
            "mohawk.stage 1",
            "mohawk.stage 2",
            "mohawk.gateway tokens",
        ]
    ]
    for span in chain:  # `pytest -s` shows the trace (docs/operations.md quotes one)
        hops = {k: v for k, v in span.attributes.items() if k.startswith(("mohawk.hop", "mohawk.queued"))}
        print(f"{span.name:24} {span.service:15} {(span.end_ns - span.start_ns) / 1e6:8.1f} ms  {hops}")
    assert chain[0].parent_span_id == client_span  # the client's own trace continues
    for parent, child in itertools.pairwise(chain):
        assert child.parent_span_id == parent.span_id, (parent.name, child.name)
    stages: list[ReceivedSpan] = chain[1:4]
    assert {s.service for s in stages} == {"mohawk-shard"}
    assert {s.service for s in (chain[0], chain[4])} == {"mohawk-gateway"}
    assert len({s.instance for s in stages}) == 3  # three processes, one span each
    assert len({s.attributes["mohawk.node"] for s in stages}) == 3
    assert all(s.attributes["mohawk.request_id"] == request_id for s in stages)
    assert [s.attributes["mohawk.stage"] for s in stages] == [0, 1, 2]
    for stage in stages[1:]:  # hop times of the frames into stages 1 and 2
        assert stage.attributes["mohawk.hop_ms.first"] >= 0
        assert stage.attributes["mohawk.hop_ms.p50"] >= 0 and stage.attributes["mohawk.steps"] >= 1
    assert stages[0].attributes["mohawk.queued_ms"] >= 0 and stages[0].attributes["mohawk.hop_ms.p50"] >= 0
    assert chain[4].attributes["mohawk.hop_ms.p50"] >= 0 and chain[4].attributes["mohawk.tokens"] == tokens
    assert chain[0].attributes["mohawk.outcome"] == "ok" and chain[0].attributes["mohawk.ttft_ms"] > 0
    assert chain[0].start_ns <= stages[0].start_ns <= stages[1].start_ns <= stages[2].start_ns
