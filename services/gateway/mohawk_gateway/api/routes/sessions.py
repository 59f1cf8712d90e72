"""The sessions API: create, infer (sync, SSE or async), poll, statistics, delete.

`POST /v1/sessions` → 201 with the session (its id); `POST /v1/sessions/{id}/infer` with only the
new input → a chat completion, an SSE stream (`stream`), or 202 with a request to poll
(`async`); `GET /v1/sessions/{id}/requests/{rid}` → that request's record; `GET
/v1/sessions/{id}` → the statistics; `DELETE /v1/sessions/{id}`. A session belongs to the tenant
that created it (by the tenant's immutable id: a tenant re-created under the same name owns none of
the old one's): any other caller gets 404, as for a session that never existed. An id that is not
`sess_` and letters, digits, `_` or `-` is 400 `invalid_session_id` before it reaches Redis.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mohawk_gateway.api.deps import GatewayDep, SessionsDep, TenantDep
from mohawk_gateway.api.respond import answer
from mohawk_gateway.errors import GatewayError
from mohawk_gateway.schemas.sessions import SessionCreate, SessionDeleted, SessionInfer
from mohawk_gateway.sessions.state import SessionState
from mohawk_gateway.sessions.stats import SessionPublic, session_public
from mohawk_gateway.sessions.turns import start_turn
from mohawk_gateway.submission import capped_priority, tenant_priority

router = APIRouter(tags=["sessions"])


def _owner(tenant: TenantDep) -> str:
    return tenant.owner_id if tenant is not None else ""


@router.post("/v1/sessions", status_code=201)
async def create_session(
    body: SessionCreate, gateway: GatewayDep, sessions: SessionsDep, tenant: TenantDep
) -> SessionPublic:
    gateway.check_model(body.model)
    asked = body.qos.priority
    if asked is not None and capped_priority(asked, tenant) != asked:
        raise GatewayError(
            403,
            f"qos.priority {asked!r} is above this API key's priority {tenant_priority(tenant)!r}",
            param="qos.priority",
            code="priority_above_tenant",
        )
    state = SessionState.new(_owner(tenant), gateway.served_model)
    state.qos, state.routing, state.system_prompt = body.qos, body.routing, body.system_prompt
    await sessions.store.create(state)
    return session_public(state)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, sessions: SessionsDep, tenant: TenantDep) -> SessionPublic:
    return session_public(await sessions.store.get(session_id, _owner(tenant)))


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, sessions: SessionsDep, tenant: TenantDep) -> SessionDeleted:
    await sessions.store.get(session_id, _owner(tenant))  # 404 unless it is the caller's
    await sessions.store.delete(session_id)
    return SessionDeleted(id=session_id)


@router.post("/v1/sessions/{session_id}/infer", response_model=None)
async def infer(
    session_id: str,
    body: SessionInfer,
    request: Request,
    gateway: GatewayDep,
    sessions: SessionsDep,
    tenant: TenantDep,
) -> Response:
    gateway.check_model(body.model)
    store = sessions.store
    state = await store.get(session_id, _owner(tenant))
    turn = await start_turn(gateway, store, state, body, tenant)
    if body.background:
        record = await sessions.background.launch(turn)
        location = f"/v1/sessions/{session_id}/requests/{record.id}"
        headers = {"Location": location, **turn.generation.rate_headers}
        return JSONResponse(record.model_dump(mode="json"), status_code=202, headers=headers)
    return await answer(request, turn.generation, turn.renderer, stream=bool(body.stream), close=turn.close)


@router.get("/v1/sessions/{session_id}/requests/{request_id}")
async def get_request(
    session_id: str, request_id: str, sessions: SessionsDep, tenant: TenantDep
) -> JSONResponse:
    await sessions.store.get(session_id, _owner(tenant))
    record = await sessions.store.get_request(session_id, request_id)
    return JSONResponse(record.model_dump(mode="json"))
