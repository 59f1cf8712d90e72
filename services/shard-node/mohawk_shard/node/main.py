"""`mohawk shard` / `python -m mohawk_shard`: run one shard node until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from mohawk_common.bus.config import served_model_name
from mohawk_common.bus.security import Security
from mohawk_common.errors import MohawkError
from mohawk_common.logging import configure_logging, get_logger
from mohawk_common.settings import load_settings
from mohawk_common.settings_flags import add_setting_flags, setting_overrides
from mohawk_common.tracing import setup_tracing
from mohawk_shard.node.config import NodeSettings

# the node's settings a flag may set: its type, choices, help and default all come from NodeSettings
FLAGS = (
    "node_id",
    "nats_url",
    "model",
    "served_model_name",
    "backend",
    "device",
    "dtype",
    "weights",
    "kv_cache_dtype",
    "memory_limit_mb",
    "num_threads",
    "weights_from",
    "model_revision",
    "state_dir",
    "pki_dir",
    "insecure",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_setting_flags(parser, NodeSettings, FLAGS)
    parser.add_argument("--log-level", default="info", help="log level (default: info)")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    configure_logging(args.log_level)
    overrides = setting_overrides(args, FLAGS)
    try:
        settings = load_settings(NodeSettings, overrides)
        model = served_model_name(settings.model, settings.served_model_name)
        security = Security.for_service(settings, role="shard", process_id=settings.node_id, models=(model,))
    except MohawkError as exc:
        get_logger("mohawk.shard").error("refusing to start", error=str(exc))
        return 2
    if setup_tracing("mohawk-shard", settings.node_id):
        get_logger("mohawk.shard").info("traces exported over OTLP")
    return asyncio.run(_serve(settings, security))


async def _serve(settings: NodeSettings, security: Security) -> int:
    from mohawk_shard.node.service import ShardNode

    node = ShardNode(settings, security)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, node.stop)
    try:
        await node.run()
    except MohawkError as exc:
        get_logger("mohawk.shard").error("shard node failed", error=str(exc))
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m mohawk_shard", description="Run one Mohawk shard node.")
    add_arguments(parser)
    return run(parser.parse_args())
