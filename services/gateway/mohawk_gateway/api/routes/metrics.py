"""GET /metrics in Prometheus' text format."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from mohawk_gateway.api.deps import GatewayDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_model=None)
async def metrics(gateway: GatewayDep) -> Response:
    return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)
