"""Wiring of a coordinator replica: settings, logging, NATS, buckets, signals, graceful stop.

SIGTERM or SIGINT stops the replica cleanly: it finishes its current step and deletes its lease
(if it holds it), so a standby takes over within one poll instead of one lease TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import structlog

from mohawk_common.bus.connect import connect
from mohawk_common.bus.security import Security
from mohawk_common.bus.setup import ensure_buckets
from mohawk_common.errors import ConfigError, MohawkError
from mohawk_common.logging import LEVELS, configure_logging
from mohawk_common.settings import load_settings
from mohawk_common.tasks import RECANCEL_S
from mohawk_coordinator.config import CoordinatorSettings
from mohawk_coordinator.coordinator import Coordinator
from mohawk_coordinator.planner import PLACEMENTS
from mohawk_coordinator.planning import load_model_shape

log = structlog.get_logger("mohawk.coordinator")
T = TypeVar("T")
MODEL_THREAD = "model-config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `mohawk coordinator` / `python -m mohawk_coordinator`; unset flags defer to env/YAML."""
    parser.add_argument("--coordinator-id", help="this replica's id (default: <hostname>-<pid>)")
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated")
    parser.add_argument("--model", help="GGUF file or safetensors directory (default: bundled SmolLM2-135M)")
    parser.add_argument("--served-model-name", help="model name nodes heartbeat (default: from the file)")
    parser.add_argument("--placement", choices=PLACEMENTS, help="spread (default) or pack")
    parser.add_argument("--lease-ttl", type=float, help="leader lease in seconds (failover time)")
    parser.add_argument("--pki-dir", help="certificate bundle (default: .mohawk/pki/nodes/<coordinator id>)")
    parser.add_argument(
        "--insecure", action="store_true", default=None, help="no certificate (development only)"
    )
    parser.add_argument("--log-level", default="info", choices=LEVELS, help="default: info")


def run(args: argparse.Namespace) -> int:
    """Run one replica until SIGTERM/SIGINT; 0 on a clean stop, 1 on a runtime error, 2 on bad settings."""
    overrides = {
        "coordinator_id": args.coordinator_id,
        "nats_url": args.nats_url,
        "model": args.model,
        "served_model_name": args.served_model_name,
        "placement": args.placement,
        "lease_ttl_s": args.lease_ttl,
        "pki_dir": getattr(args, "pki_dir", None),
        "insecure": getattr(args, "insecure", None),
    }
    try:
        settings = load_settings(CoordinatorSettings, overrides)
        configure_logging(args.log_level)
        # The coordinator carries no prompt or activation, but it decides who serves: it starts
        # only as a certified coordinator, like every other service.
        Security.for_service(settings, role="coordinator", process_id=settings.coordinator_id)
    except ConfigError as exc:
        print(f"mohawk coordinator: error: {exc}", file=sys.stderr)
        return 2
    code = 0
    try:
        asyncio.run(serve(settings))
    except asyncio.CancelledError:  # stopped before the replica ran: nothing to release
        pass
    except MohawkError as exc:
        log.error("coordinator failed", error=str(exc))
        code = 1
    _exit_now_if_loading(code)  # failed (code 1) while the loader thread still imports
    return code


async def serve(settings: CoordinatorSettings) -> None:
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
        nc = await connect(settings.nats_servers, name=f"coordinator-{settings.coordinator_id}")
        try:
            buckets = await ensure_buckets(nc.jetstream(), settings.bus_limits())
            # reading the model's config imports transformers (seconds): the replica campaigns meanwhile
            shape = in_background(lambda: load_model_shape(settings.model), name=MODEL_THREAD)
            coordinator = Coordinator(settings, nc, buckets, shape)
            await coordinator.run()
        finally:
            await nc.close()
        _exit_now_if_loading(0)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _exit_now_if_loading(code: int) -> None:
    """Stopped (lease released, NATS closed) while the loader thread still imports transformers and
    torch: leave now, with `code`. Tearing the event loop and the interpreter down would wait on that import
    (its module locks, torch's exit hooks), for tens of seconds on a busy machine."""
    if any(t.name == MODEL_THREAD and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def in_background(work: Callable[[], T], *, name: str) -> asyncio.Future[T]:
    """Run `work` on a daemon thread (which never holds up process exit); its result as a future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            result = work()
        except BaseException as exc:  # handed to the event loop, which raises it in the coordinator
            settle = functools.partial(_set_exception, future, exc)
        else:
            settle = functools.partial(_set_result, future, result)
        with contextlib.suppress(RuntimeError):  # the loop closed first: nobody is waiting
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
