"""GET /v1/models and /v1/models/{model}: the one model this gateway serves."""

from __future__ import annotations

from fastapi import APIRouter

from mohawk_gateway.api.deps import GatewayDep
from mohawk_gateway.schemas.common import ModelListPublic, ModelPublic
from mohawk_gateway.shared_state import Gateway

router = APIRouter(tags=["models"])


def _model(gateway: Gateway) -> ModelPublic:
    return ModelPublic(
        id=gateway.served_model,
        created=gateway.created,
        root=gateway.settings.model or gateway.served_model,
        max_model_len=gateway.max_model_len,
    )


@router.get("/v1/models")
async def list_models(gateway: GatewayDep) -> ModelListPublic:
    return ModelListPublic(data=[_model(gateway)])


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, gateway: GatewayDep) -> ModelPublic:
    gateway.check_model(model)
    return _model(gateway)
