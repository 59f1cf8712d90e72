"""`mohawk telemetry`: the cluster's one Prometheus endpoint and its live dashboard."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mohawk_common.env_knobs import env_knob

DEFAULT_PORT = 9300
PORT_ENV = env_knob(
    "MOHAWK_TELEMETRY_PORT", str(DEFAULT_PORT), "the telemetry service's HTTP port (/metrics, /)"
)
TRUST_ROOT_ENV = env_knob(
    "MOHAWK_TRUST_ROOT",
    "",
    "the telemetry service's root.pub: only signed plans, heartbeats and reports count",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mohawk_common.bus.config import DEFAULT_NATS_URL
    from mohawk_common.bus.setup import NODE_TTL_S as node_ttl_s  # the default every process has

    parser.add_argument(
        "--nats-url", help=f"NATS server URL(s) (default: MOHAWK_NATS_URL or {DEFAULT_NATS_URL})"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get(PORT_ENV, DEFAULT_PORT)),
        help=f"HTTP port: /metrics, the dashboard at / (default: MOHAWK_TELEMETRY_PORT or {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--node-ttl-s",
        type=float,
        default=float(os.environ.get("MOHAWK_NODE_TTL_S", node_ttl_s)),
        help=f"a node silent this long is shown down (default: MOHAWK_NODE_TTL_S or {node_ttl_s}, "
        "the bus setting every process reads)",
    )
    parser.add_argument(
        "--trust-root",
        type=Path,
        default=os.environ.get(TRUST_ROOT_ENV),
        help="the operator root's public key (root.pub of any bundle; default: MOHAWK_TRUST_ROOT): "
        "show only plans and heartbeats whose signatures verify",
    )
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from mohawk_common.bus.config import BusSettings
    from mohawk_common.logging import configure_logging
    from mohawk_common.settings import load_settings
    from mohawk_telemetry.app import create_app

    configure_logging(args.log_level)
    # the bus settings every service reads (MOHAWK_NATS_URL, config/mohawk.yaml), the flag on top
    bus = load_settings(BusSettings, {"nats_url": args.nats_url} if args.nats_url else {})
    servers = bus.nats_servers
    trust = None
    if args.trust_root is not None:
        from mohawk_pqc.certificates import Root, TrustStore
        from mohawk_pqc.pki_files import read_message
        from mohawk_proto.v1 import security_pb2

        trust = TrustStore(Root(read_message(Path(args.trust_root), security_pb2.RootPublicKey)))
    app = create_app(servers, node_ttl_s=args.node_ttl_s, trust=trust)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
