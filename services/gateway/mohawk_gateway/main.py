"""Wiring of the gateway process: flags, settings, logging, uvicorn; SIGTERM and Ctrl-C drain.

On SIGTERM (or the first Ctrl-C) uvicorn stops accepting connections and waits up to
`drain_timeout_s` for open requests; streams still open then are cancelled, which cancels their
requests on the bus. The lifespan then drains the NATS connection.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from mohawk_common.errors import ConfigError, MohawkError
from mohawk_common.logging import configure_logging, get_logger
from mohawk_common.settings import load_settings
from mohawk_common.settings_flags import add_setting_flags, setting_overrides
from mohawk_common.tracing import setup_tracing
from mohawk_gateway.app import create_app, load_security
from mohawk_gateway.config import GatewaySettings

log = get_logger("mohawk.gateway")


# the settings a flag may set: type, choices, help and default from GatewaySettings
FLAGS = (
    "host",
    "port",
    "nats_url",
    "model",
    "served_model_name",
    "log_level",
    "gateway_id",
    "pki_dir",
    "insecure",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's flags; unset flags fall back to env MOHAWK_*, config/mohawk.yaml, defaults."""
    add_setting_flags(parser, GatewaySettings, FLAGS)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    overrides = setting_overrides(args, FLAGS)
    return load_settings(GatewaySettings, overrides)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain; 0 after a clean stop, 2 for bad settings (one line)."""
    try:
        settings = settings_from_args(args)
        configure_logging(settings.log_level)
        if settings.model is not None and not Path(settings.model).expanduser().exists():
            raise ConfigError(f"model path {settings.model} does not exist")
        security = load_security(settings)
    except MohawkError as exc:
        sys.stderr.write(f"mohawk gateway: error: {exc}\n")
        return 2
    if setup_tracing("mohawk-gateway", settings.gateway_id):
        log.info("traces exported over OTLP")
    config = uvicorn.Config(
        create_app(settings, security=security),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s),
        timeout_keep_alive=math.ceil(settings.keep_alive_s),
    )
    server = _Server(config)
    log.info("gateway listening", host=settings.host, port=settings.port, model=settings.served_model)
    server.run()
    return 0 if server.started else 1


class _Server(uvicorn.Server):
    """uvicorn's server, except that a SIGTERM or Ctrl-C it has drained for ends `run` normally
    (uvicorn re-raises the signal after shutting down, which would kill the process instead)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mohawk_gateway", description="Mohawk's OpenAI gateway")
    add_arguments(parser)
    return run(parser.parse_args(argv))
