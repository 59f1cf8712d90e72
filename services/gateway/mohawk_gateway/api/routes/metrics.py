"""GET /metrics in Prometheus' text format. With auth on it needs the metrics key (`Access.
check_metrics_key`); the gateway's metrics port serves the same registry with no key."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from mohawk_gateway.api.deps import GatewayDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_model=None)
async def metrics(request: Request, gateway: GatewayDep) -> Response:
    gateway.access.check_metrics_key(request.headers.get("authorization"))
    return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)
