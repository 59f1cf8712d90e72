"""`create_app`: the gateway's FastAPI application, wired from settings (nothing built at import time)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import Depends, FastAPI
from prometheus_client import CollectorRegistry

from mohawk_common.bus.security import Security
from mohawk_common.metrics_port import serve_metrics
from mohawk_common.tasks import cancel_and_wait
from mohawk_gateway.access import Access
from mohawk_gateway.api.deps import get_tenant
from mohawk_gateway.api.errors import install_error_handlers
from mohawk_gateway.api.routes import chat, completions, health, metrics, models, sessions
from mohawk_gateway.bus import BusClient
from mohawk_gateway.config import GatewaySettings
from mohawk_gateway.idle_memory import give_back_memory_when_idle
from mohawk_gateway.metrics import GatewayMetrics
from mohawk_gateway.middleware import AdmissionMiddleware, BodyLimitMiddleware, MetricsMiddleware
from mohawk_gateway.request_trace import TraceContextMiddleware
from mohawk_gateway.sessions import Sessions
from mohawk_gateway.shared_state import Gateway
from mohawk_gateway.tokenizer import PromptCodec, Tokenizer, load_tokenizer

log = structlog.get_logger("mohawk.gateway")

API_ROUTERS = (chat.router, completions.router, models.router, sessions.router)  # /v1: a tenant's key
OPEN_ROUTERS = (health.router, metrics.router)
ROUTERS = (*API_ROUTERS, *OPEN_ROUTERS)


def create_app(
    settings: GatewaySettings,
    *,
    tokenizer: Tokenizer | None = None,
    registry: CollectorRegistry | None = None,
    security: Security | None = None,
) -> FastAPI:
    """The gateway app. Its lifespan connects to NATS in the background and loads the model's
    tokenizer in a thread (unless `tokenizer` is given), so /health answers from the start."""
    gateway_metrics = GatewayMetrics(registry)
    if security is None:
        security = load_security(settings)
    security.on_reject = lambda reason: gateway_metrics.security_rejections.labels(reason=reason).inc()
    bus = BusClient(settings, security)
    gateway = Gateway(settings, bus, gateway_metrics, Access(settings))
    sessions = Sessions(settings, gateway.access.redis)
    if tokenizer is not None:
        gateway.codec = PromptCodec(tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bus.start()
        loader = None if gateway.codec is not None else asyncio.create_task(_load_codec(gateway))
        reports = asyncio.create_task(gateway.reports.run(), name="request-reports")
        idle = asyncio.create_task(
            give_back_memory_when_idle(
                lambda: gateway.num_started + gateway.num_ended,
                lambda: gateway.num_started > gateway.num_ended,
            ),
            name="idle-memory",
        )
        log.info("gateway starting", model=gateway.served_model, nats=settings.nats_url)
        metrics_server = serve_metrics(
            settings.metrics_port, settings.metrics_host, gateway_metrics.registry.collect
        )
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            await cancel_and_wait(loader, reports, idle)
            await gateway.reports.flush()
            await sessions.close()
            await bus.close()
            await gateway.access.close()
            log.info("gateway stopped")

    app = FastAPI(
        title="Mohawk gateway", summary="OpenAI-compatible API over the Mohawk bus", lifespan=lifespan
    )
    app.state.gateway = gateway
    app.state.sessions = sessions
    install_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router, dependencies=[Depends(get_tenant)])
    for router in OPEN_ROUTERS:
        app.include_router(router)
    paths = (str(getattr(route, "path", "")) for router in ROUTERS for route in router.routes)
    endpoints = frozenset(path for path in paths if path and "{" not in path)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AdmissionMiddleware, admission=gateway.admission, paths=GENERATION_PATHS)
    app.add_middleware(MetricsMiddleware, metrics=gateway_metrics, endpoints=endpoints)
    app.add_middleware(TraceContextMiddleware)
    return app


GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def load_security(settings: GatewaySettings) -> Security:
    """The gateway's certificate bundle; ConfigError (refuse to start) unless run insecure."""
    return Security.for_service(
        settings, role="gateway", process_id=settings.gateway_id, models=(settings.served_model,)
    )


async def _load_codec(gateway: Gateway) -> None:
    model = gateway.settings.model
    try:
        tokenizer = await asyncio.to_thread(load_tokenizer, model)
        gateway.codec = PromptCodec(tokenizer)
    except Exception as exc:  # the gateway stays up and /ready says why
        gateway.tokenizer_error = "the model's tokenizer could not be loaded (the gateway's log says why)"
        log.error("tokenizer not loaded", model=model or "bundled", error=str(exc))
        return
    log.info("tokenizer loaded", model=model or "bundled", vocab_size=gateway.codec.vocab_size)
