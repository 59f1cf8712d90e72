"""Dependencies of the routes, as `Annotated` aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from mohawk_common.tenancy import Tenant
from mohawk_gateway.sessions import Sessions
from mohawk_gateway.shared_state import Gateway


async def get_gateway(request: Request) -> Gateway:
    """async, so FastAPI calls it on the loop instead of a thread-pool hop every request."""
    return cast(Gateway, request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_tenant(request: Request, gateway: GatewayDep) -> Tenant | None:
    """The calling tenant (401 for a missing or wrong key with auth on); None = anonymous.
    Every /v1 router depends on it, so FastAPI resolves it once per request."""
    return await gateway.access.authenticate(request.headers.get("authorization"))


TenantDep = Annotated[Tenant | None, Depends(get_tenant)]


async def get_sessions(request: Request) -> Sessions:
    return cast(Sessions, request.app.state.sessions)


SessionsDep = Annotated[Sessions, Depends(get_sessions)]
