"""The dashboard page in a real headless Chromium: the real static files, served with a stand-in
`/api/state` and `/api/events` (a `snapshot` event every 0.2 s) by a small Starlette app under uvicorn,
so the page's JavaScript runs against the wire format the telemetry service sends."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import mohawk_telemetry
from mohawk_telemetry.snapshot import (
    ClusterSnapshot,
    NodeView,
    Percentiles,
    PipelineView,
    PlanView,
    Series,
    StageView,
)
from tests.telemetry.browser import launch_chromium

STATIC_DIR = Path(mohawk_telemetry.__file__).parent / "static"
EVENT_INTERVAL_S = 0.2
MAX_EVENTS = 300  # a minute of events: the stream ends even if the browser never disconnects
PLAN_VERSION = 7
STAGE_NODE_IDS = ("shard-1", "shard-2", "shard-3")
SPARE_NODE_ID = "shard-4"
NUM_LAYERS = 30
GIB = 1 << 30


def synthetic_snapshot(tick: int) -> ClusterSnapshot:
    """One pipeline of three stages and a spare; tokens/s rises with `tick`."""
    tokens_per_s = 40.0 + 12.5 * tick
    bounds = [(i * NUM_LAYERS // 3, (i + 1) * NUM_LAYERS // 3) for i in range(3)]
    stages = [
        StageView(node_id=node_id, stage=i, start=start, end=end)
        for i, (node_id, (start, end)) in enumerate(zip(STAGE_NODE_IDS, bounds, strict=True))
    ]
    nodes = [
        NodeView(
            node_id=s.node_id,
            up=True,
            backend="mlx" if s.stage == 1 else "torch",
            device="mps" if s.stage == 1 else "cuda:0",
            weights_format="bf16",
            memory_used_bytes=(2 + s.stage) * GIB,
            memory_limit_bytes=8 * GIB,
            pipeline=0,
            stage=s.stage,
            start=s.start,
            end=s.end,
            loaded=True,
            busy_share=0.5 + 0.1 * s.stage,
            bubble_share=0.3 - 0.1 * s.stage,
            tokens_per_s=tokens_per_s,
            batch_size=4.0,
            queue_depth=tick % 5 if s.stage == 0 else 0,
            running=4 if s.stage == 0 else 0,
            kv_blocks_used=100 + tick,
            kv_blocks_total=512,
            hop_ms_p50=1.5,
            hop_ms_p99=4.0,
            security_rejections={"bad_signature": 2} if s.stage == 2 else {},
        )
        for s in stages
    ]
    nodes.append(NodeView(node_id=SPARE_NODE_ID, up=False, backend="torch", device="cpu"))
    now = time.time()
    num_points = 10 + tick
    return ClusterSnapshot(
        time=now,
        model="smollm2-135m-instruct",
        plan=PlanView(
            version=PLAN_VERSION,
            state="active",
            leader="coordinator-a",
            pipelines=[
                PipelineView(id=0, epoch=PLAN_VERSION, active=True, stages=stages, tokens_per_s=tokens_per_s)
            ],
            spares=[SPARE_NODE_ID],
        ),
        nodes=nodes,
        series=Series(
            t=[now - (num_points - 1 - i) for i in range(num_points)],
            tokens_per_s=[tokens_per_s * (i + 1) / num_points for i in range(num_points)],
            queue_depth=[i % 5 for i in range(num_points)],
        ),
        ttft_ms=Percentiles(p50=120.0, p95=250.0, p99=400.0, count=37),
        itl_ms=Percentiles(p50=18.0, p95=30.0, p99=45.0, count=1200),
        security_rejections={"bad_signature": 2},
    )


async def index(_: Request) -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html")


async def state(_: Request) -> JSONResponse:
    return JSONResponse(synthetic_snapshot(0).model_dump(mode="json"))


async def events(_: Request) -> StreamingResponse:
    async def stream() -> AsyncIterator[str]:
        for tick in range(1, MAX_EVENTS + 1):
            yield f"event: snapshot\ndata: {synthetic_snapshot(tick).model_dump_json()}\n\n"
            await asyncio.sleep(EVENT_INTERVAL_S)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def dashboard_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/state", state),
            Route("/api/events", events),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ]
    )


@pytest.fixture
def dashboard_url() -> Iterator[str]:
    """The app under uvicorn in a thread, on a socket bound to a free port before it starts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(dashboard_app(), log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()


def test_dashboard_renders_and_updates_live(dashboard_url: str, tmp_path: Path) -> None:
    with launch_chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        request_urls: list[str] = []
        page_errors: list[str] = []
        page.on("request", lambda request: request_urls.append(request.url))
        page.on("pageerror", lambda error: page_errors.append(str(error)))

        page.goto(dashboard_url + "/")
        page.wait_for_function("document.getElementById('connection').textContent === 'live'", timeout=5000)
        page.wait_for_selector(f"#nodes .node[data-node-id='{SPARE_NODE_ID}']", timeout=5000)

        node_ids = page.eval_on_selector_all("#nodes .node", "nodes => nodes.map(n => n.dataset.nodeId)")
        assert sorted(node_ids) == sorted([*STAGE_NODE_IDS, SPARE_NODE_ID])
        chain_ids = page.eval_on_selector_all(
            "#nodes .pipeline .node", "nodes => nodes.map(n => n.dataset.nodeId)"
        )
        assert chain_ids == list(STAGE_NODE_IDS)
        assert "down" in (page.get_attribute(f".node[data-node-id='{SPARE_NODE_ID}']", "class") or "")
        assert page.text_content("#plan-version") == str(PLAN_VERSION)
        assert page.text_content("#leader") == "coordinator-a"

        first = page.text_content("#tokens-per-s") or ""
        page.wait_for_function(
            "first => document.getElementById('tokens-per-s').textContent !== first", arg=first, timeout=2000
        )
        latest = float(page.text_content("#tokens-per-s") or "nan")
        assert latest > 0
        assert latest != float(first)

        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        page.close()

    assert (tmp_path / "dashboard.png").stat().st_size > 0
    assert page_errors == []
    assert request_urls, "the page made no requests"
    foreign = [url for url in request_urls if urlparse(url).hostname != "127.0.0.1"]
    assert foreign == []
