"""Dependencies of the routes, as `Annotated` aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from mohawk_gateway.handlers import Gateway


def get_gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
