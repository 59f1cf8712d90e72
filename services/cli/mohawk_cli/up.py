"""`mohawk up`: a whole local cluster on the bundled model, until Ctrl-C; a crashed child is restarted
(`Supervisor`), and one child dying never stops the others.

The cluster includes a redis-server from PATH (tenants, API keys, rate limits and sessions, kept
under `<data-dir>/redis`) unless `--no-redis`; where none is installed, `mohawk up` says how to
install one and runs without those. `--auth` makes every /v1 call need a tenant's key.

NATS admits only users of Mohawk's NATS operator, made on first start under
`<data-dir>/pki/nats-auth` (`mohawk_common.bus.nats_auth`); each child gets a user of its own,
issued beside its certificate and allowed only its own subjects, `mohawk bus` takes the ops user
(`--creds <data-dir>/pki/nats-auth/creds/ops.creds`), and `mohawk pki revoke --pki-dir
<data-dir>/pki` revokes a node's user on the bus too. `--no-nats-auth` turns this off.
NATS also takes TLS only, its certificate from the bus CA under `<data-dir>/pki/nats-tls`
(`mohawk_common.bus.nats_tls`), which every child trusts through MOHAWK_NATS_TLS_CA (and `mohawk
bus` with the same variable); `--no-nats-tls` turns that off.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from mohawk_cli.cluster import ClusterError, ClusterSpec, LocalCluster
from mohawk_cli.load_watch import LoadWatch
from mohawk_cli.redis_server import INSTALL_HINT, PASSWORD_FILE, find_redis_server
from mohawk_cli.seal_schedule import DEFAULT_SEAL_ROTATION_DAYS, SealSchedule
from mohawk_cli.supervisor import Supervisor
from mohawk_common.errors import MohawkError
from mohawk_shard.config import add_format_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="shard nodes splitting the layers (default 2)")
    parser.add_argument(
        "--backends",
        help="one backend per node in stage order, comma-separated, e.g. torch,mlx,torch (default torch)",
    )
    parser.add_argument(
        "--replicas",
        help="pipelines the coordinator forms: N or auto (default 1; with --placement pack a node that "
        "holds the whole model is a pipeline of its own)",
    )
    parser.add_argument("--placement", choices=("spread", "pack"), help="layer placement (default spread)")
    parser.add_argument("--coordinators", type=int, default=1, help="coordinator replicas (2 = a standby)")
    parser.add_argument("--port", type=int, default=8000, help="gateway port on 127.0.0.1 (default 8000)")
    parser.add_argument("--nats-port", type=int, help="nats-server port (default 4222, or a free one)")
    parser.add_argument("--redis-port", type=int, help="redis-server port (default 6379, or a free one)")
    parser.add_argument(
        "--telemetry-port",
        type=int,
        help="telemetry service port: /metrics, dashboard (default 9300, or a free one)",
    )
    parser.add_argument("--no-telemetry", action="store_true", help="do not start the telemetry service")
    parser.add_argument(
        "--no-redis",
        action="store_true",
        help="start no redis-server (no tenants, keys, rate limits, sessions)",
    )
    parser.add_argument(
        "--auth", action="store_true", help="every /v1 call needs a tenant's API key (mohawk tenant add)"
    )
    parser.add_argument(
        "--no-nats-auth",
        action="store_true",
        help="run NATS with no users: any local client may read and write the bus (development)",
    )
    parser.add_argument(
        "--no-nats-tls",
        action="store_true",
        help="run NATS in plaintext: the bus's traffic readable on this machine's loopback (development)",
    )
    parser.add_argument(
        "--seal-rotation-days",
        type=float,
        default=DEFAULT_SEAL_ROTATION_DAYS,
        help="rotate each model's request-sealing key this often (default %(default)g; it also rotates "
        "on every revocation)",
    )
    parser.add_argument("--model", help="GGUF file or safetensors directory (default: bundled SmolLM2-135M)")
    add_format_flags(parser)  # passed on to every shard node
    parser.add_argument("--data-dir", default=".mohawk", help="NATS data and logs (default .mohawk)")
    parser.add_argument("--log-level", default="info", help="log level of the services (default info)")


def _format_args(args: argparse.Namespace) -> tuple[str, ...]:
    flags = {"--weights": args.weights, "--kv-cache-dtype": args.kv_cache_dtype}
    return tuple(part for flag, value in flags.items() if value for part in (flag, value))


def _coordinator_env(args: argparse.Namespace) -> dict[str, str]:
    values = {"MOHAWK_REPLICAS": args.replicas, "MOHAWK_PLACEMENT": args.placement}
    return {name: value for name, value in values.items() if value}


def redis_choice(args: argparse.Namespace) -> tuple[bool, str | None]:
    """Whether to start a redis-server, and what to tell the user about it (None: nothing)."""
    if args.no_redis:
        return False, None
    if find_redis_server() is None:
        return False, (
            f"redis-server not found, so no tenants, API keys, rate limits or sessions; {INSTALL_HINT} "
            "(or pass --no-redis)"
        )
    return True, None


def run_up(args: argparse.Namespace) -> int:
    backends = tuple(b.strip() for b in (args.backends or "").split(",") if b.strip())
    if not args.seal_rotation_days > 0:
        print("mohawk up: error: --seal-rotation-days must be positive", file=sys.stderr)
        return 2
    if args.nodes < 1 or args.coordinators < 1:
        print("mohawk up: error: --nodes and --coordinators must be at least 1", file=sys.stderr)
        return 2
    if (
        args.replicas
        and args.replicas != "auto"
        and not (args.replicas.isdigit() and int(args.replicas) >= 1)
    ):
        print(
            f"mohawk up: error: --replicas must be auto or a number >= 1, got {args.replicas!r}",
            file=sys.stderr,
        )
        return 2
    if backends and (len(backends) != args.nodes or not set(backends) <= {"torch", "mlx"}):
        print(
            f"mohawk up: error: --backends needs {args.nodes} names of torch or mlx, got {args.backends!r}",
            file=sys.stderr,
        )
        return 2
    with_redis, note = redis_choice(args)
    if note is not None:
        print(f"mohawk up: {note}", file=sys.stderr)
    if args.auth and not with_redis:
        print("mohawk up: error: --auth needs a redis-server for its tenants and keys", file=sys.stderr)
        return 2
    spec = ClusterSpec(
        nodes=args.nodes,
        backends=backends,
        coordinators=args.coordinators,
        port=args.port,
        nats_port=args.nats_port,
        data_dir=Path(args.data_dir),
        model=args.model,
        log_level=args.log_level,
        node_args=_format_args(args),
        env=_coordinator_env(args),
        redis=with_redis,
        redis_port=args.redis_port,
        gateway_env={"MOHAWK_AUTH": "true"} if args.auth else {},
        telemetry=not args.no_telemetry,
        telemetry_port=args.telemetry_port,
        nats_auth=not args.no_nats_auth,
        nats_tls=not args.no_nats_tls,
    )
    cluster = LocalCluster(spec)
    stopping = False

    def _interrupt(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        redis = f"redis on {cluster.redis.public_url}, " if cluster.redis is not None else ""
        print(
            f"mohawk up: nats on {cluster.nats.url}, {redis}{spec.coordinators} coordinator(s), "
            f"{spec.nodes} shard node(s), gateway on {cluster.url}; logs in {cluster.log_dir}/",
            file=sys.stderr,
        )
        cluster.start()
        _wait_ready(cluster, lambda: stopping)
        if not stopping:
            _banner(cluster)
        supervisor = Supervisor(cluster)
        seal_schedule = SealSchedule(
            cluster.pki_dir,
            [cluster.nats.url],
            args.seal_rotation_days,
            creds=cluster.nats_creds("admin"),
            tls_ca=cluster.nats_tls_ca,
        )
        while not stopping:
            time.sleep(0.5)
            # Ctrl-C in a terminal reaches the children too (one process group): once it has come,
            # a child that exits is one being stopped, not one to restart
            if not stopping:
                supervisor.poll(time.monotonic(), on_event=_say)
                for event in seal_schedule.poll(time.monotonic()):
                    _say(event)
    except MohawkError as exc:  # ClusterError, or a server (nats, redis) that would not start
        print(f"mohawk up: error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("mohawk up: stopping...", file=sys.stderr)
        cluster.stop()
    return 0


def _say(event: str) -> None:
    print(f"mohawk up: {event}", file=sys.stderr, flush=True)


def _wait_ready(cluster: LocalCluster, interrupted: object) -> None:
    """Until the gateway is ready, saying how far each node's weights have loaded."""
    deadline = time.monotonic() + 300
    watch = LoadWatch(cluster.log_dir, _say)
    while time.monotonic() < deadline:
        if callable(interrupted) and interrupted():
            return
        try:
            watch.poll()
            cluster.wait_ready(timeout=1.0)
            watch.poll()  # the last of it, which a fast load logs just before it is ready
            return
        except ClusterError as exc:
            if "exited" in str(exc) and not (callable(interrupted) and interrupted()):
                raise
    raise ClusterError(f"not ready after 300 s; see the logs in {cluster.log_dir}/")


def _banner(cluster: LocalCluster) -> None:
    name = cluster.served_model  # what the gateway serves: the bundled name or the file's stem
    auth = ' -H "Authorization: Bearer $KEY"' if cluster.spec.gateway_env.get("MOHAWK_AUTH") else ""
    tenants = (
        f"""
  KEY=$(mohawk tenant add acme --rpm 60 --redis-url {cluster.redis.public_url} \\
    --redis-password-file {cluster.data_dir / "redis" / PASSWORD_FILE})   # a tenant and its API key"""
        if cluster.redis is not None
        else ""
    )
    telemetry = (
        f"\n  {cluster.telemetry_url}/   # live dashboard; {cluster.telemetry_url}/metrics for Prometheus"
        if cluster.telemetry_url
        else ""
    )
    ops = cluster.nats_creds("ops")
    creds = f" --creds {ops}" if ops is not None else ""
    ca = cluster.nats_tls_ca
    plan_env = f"MOHAWK_NATS_CREDS={ops} " if ops is not None else ""
    bus_env = f"MOHAWK_NATS_TLS_CA={ca} " if ca is not None else ""
    plan_env = bus_env + plan_env
    print(
        f"""
Mohawk is ready: {cluster.url}/v1  (OpenAI-compatible; model "{name}")
{tenants}
  curl {cluster.url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\
    -d '{{"model": "{name}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  {plan_env}mohawk plan --explain --nats-url {cluster.nats.url}     # who holds which layers{telemetry}
  {bus_env}mohawk bus{creds} streams --nats-url {cluster.nats.url}       # the bus (= nats -s URL stream ls)
  mohawk bus server --monitor-url {cluster.nats.monitor_url}   # connections, JetStream use

Ctrl-C stops everything.""",
        flush=True,
    )
