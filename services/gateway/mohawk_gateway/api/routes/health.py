"""GET /health (alive: always 200) and GET /ready (200 only when requests can be served)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from mohawk_gateway.api.deps import GatewayDep

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(gateway: GatewayDep) -> JSONResponse:
    reason = gateway.not_ready_reason()
    if reason is not None:
        headers = {"Retry-After": str(gateway.settings.retry_after_s)}
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503, headers=headers)
    plan = gateway.bus.plan
    body = {
        "status": "ready",
        "model": gateway.served_model,
        "plan_version": plan.version if plan is not None else None,
        "max_model_len": gateway.max_model_len,
    }
    return JSONResponse(body)
