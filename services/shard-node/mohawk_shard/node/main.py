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
from mohawk_common.tracing import setup_tracing
from mohawk_shard.config import add_format_flags
from mohawk_shard.node.config import NodeSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", help="unique node id (default: hostname)")
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated")
    parser.add_argument("--model", help="GGUF file or safetensors directory (default: bundled SmolLM2-135M)")
    parser.add_argument("--served-model-name", help="model name in the API")
    parser.add_argument("--backend", choices=("torch", "mlx"), help="array library (default torch)")
    parser.add_argument("--device", help="auto, cpu, cuda, cuda:N (torch); auto, cpu, gpu (mlx)")
    parser.add_argument("--dtype", help="auto, float32, bfloat16, float16")
    add_format_flags(parser)
    parser.add_argument("--memory-limit-mb", type=int, help="memory offered for weights + KV")
    parser.add_argument("--num-threads", type=int, help="torch CPU threads")
    parser.add_argument(
        "--weights-from", choices=("disk", "bus"), help="model file, or slice package on the bus"
    )
    parser.add_argument("--model-revision", help="with --weights-from bus: the revision the slice must carry")
    parser.add_argument("--state-dir", help="kept across restarts (default: .mohawk/state/<node id>)")
    parser.add_argument("--pki-dir", help="certificate bundle (default: .mohawk/pki/nodes/<node id>)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="no certificate, plaintext bus (development only)",
    )
    parser.add_argument("--log-level", default="info", help="log level (default: info)")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    configure_logging(args.log_level)
    overrides = {
        key: value
        for key in (
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
            "pki_dir",
            "insecure",
            "weights_from",
            "model_revision",
            "state_dir",
        )
        if (value := getattr(args, key, None)) is not None
    }
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
