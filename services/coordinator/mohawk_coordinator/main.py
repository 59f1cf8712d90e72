"""Wiring of a coordinator replica: settings, logging, NATS, buckets, signals, graceful stop.

SIGTERM or SIGINT stops the replica cleanly: it finishes its current step and deletes its lease
(if it holds it), so a standby takes over within one poll instead of one lease TTL. The replica
never opens the model file: it plans from what the shard nodes report in their heartbeats, so it
imports neither transformers nor torch.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import structlog

from mohawk_common.bus.connect import connect
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.errors import ConfigError, MohawkError
from mohawk_common.logging import LEVELS, configure_logging
from mohawk_common.metrics_port import serve_metrics
from mohawk_common.settings import load_settings
from mohawk_common.settings_flags import add_setting_flags, setting_overrides
from mohawk_common.tasks import RECANCEL_S
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.coordinator import Coordinator
from mohawk_coordinator.departures import hear_advisories

log = structlog.get_logger("mohawk.coordinator")


# the settings a flag may set: type, choices, help and default from CoordinatorSettings
FLAGS = (
    "coordinator_id",
    "nats_url",
    "model",
    "served_model_name",
    "placement",
    "replicas",
    "lease_ttl_s",
    "pki_dir",
    "state_dir",
    "events_creds",
    "insecure",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `mohawk coordinator` / `python -m mohawk_coordinator`; unset flags defer to env/YAML."""
    add_setting_flags(parser, CoordinatorSettings, FLAGS)
    parser.add_argument("--log-level", default="info", choices=LEVELS, help="default: info")


def run(args: argparse.Namespace) -> int:
    """Run one replica until SIGTERM/SIGINT; 0 on a clean stop, 1 on a runtime error, 2 on bad settings."""
    overrides = setting_overrides(args, FLAGS)
    try:
        settings = load_settings(CoordinatorSettings, overrides)
        configure_logging(args.log_level)
        # The coordinator carries no prompt or activation, but it decides who serves: it starts
        # only as a certified coordinator, like every other service.
        security = Security.for_service(settings, role="coordinator", process_id=settings.coordinator_id)
    except ConfigError as exc:
        print(f"mohawk coordinator: error: {exc}", file=sys.stderr)
        return 2
    code = 0
    try:
        asyncio.run(serve(settings, security))
    except asyncio.CancelledError:  # stopped before the replica ran: nothing to release
        pass
    except MohawkError as exc:
        log.error("coordinator failed", error=str(exc))
        code = 1
    return code


async def serve(settings: CoordinatorSettings, security: Security | None = None) -> None:
    """Connect, make sure the buckets exist, and run the replica until SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    serving = asyncio.current_task()
    coordinator: Coordinator | None = None

    def on_signal() -> None:
        if coordinator is not None:
            coordinator.stop()
        elif serving is not None and not serving.done():
            serving.cancel()  # still connecting: nothing to hand over
            # a NATS call may swallow that cancel (see mohawk_common.tasks): ask again until it ends
            loop.call_later(RECANCEL_S, on_signal)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        nc = await connect(
            settings.nats_servers,
            name=f"coordinator-{settings.coordinator_id}",
            creds=settings.bus_creds(settings.coordinator_id),
            tls_ca=settings.nats_tls_ca,
        )
        try:
            buckets = await ensure_buckets(nc.jetstream(), settings.bus_limits())
            coordinator = Coordinator(settings, nc, buckets, security=security)
            serve_metrics(settings.metrics_port, settings.metrics_host, coordinator.metrics)
            events = await hear_advisories(settings, coordinator.heard)
            try:
                await coordinator.run()
            finally:
                if events is not None:
                    await events.close()
        finally:
            await nc.close()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
