"""The telemetry service's HTTP side: `/metrics` for Prometheus, the dashboard at `/` with its
static files, `/api/state` (one `ClusterSnapshot`), `/api/events` (the same, as a server-sent
`snapshot` event every second, so the page updates live), and `/health`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from mohawk_common.bus.setup import NODE_TTL_S
from mohawk_pqc.certificates import TrustStore
from mohawk_telemetry.cluster_state import ClusterState
from mohawk_telemetry.exporter import Exporter
from mohawk_telemetry.follower import BusFollower

STATIC = Path(__file__).parent / "static"
EVENT_INTERVAL_S = 1.0


def create_app(
    nats_servers: list[str],
    *,
    node_ttl_s: float = NODE_TTL_S,
    follow: bool = True,
    trust: TrustStore | None = None,
) -> FastAPI:
    state = ClusterState(node_ttl_s=node_ttl_s)
    exporter = Exporter(state)
    follower = BusFollower(nats_servers, state, exporter, trust)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if follow:
            await follower.start()
        try:
            yield
        finally:
            await follower.stop()

    app = FastAPI(title="Mohawk telemetry", lifespan=lifespan)
    app.state.cluster = state
    app.state.exporter = exporter

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(exporter.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> dict[str, object]:
        connected = follower.nc is not None and follower.nc.is_connected
        return {"status": "ok" if connected else "connecting", "nodes": len(state.nodes)}

    @app.get("/api/state")
    async def snapshot() -> JSONResponse:
        return JSONResponse(state.snapshot().model_dump(mode="json"))

    @app.get("/api/events")
    async def events(request: Request) -> StreamingResponse:
        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                yield f"event: snapshot\ndata: {state.snapshot().model_dump_json()}\n\n"
                await asyncio.sleep(EVENT_INTERVAL_S)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    @app.get("/")
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
