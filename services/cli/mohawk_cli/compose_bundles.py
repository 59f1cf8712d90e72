"""`mohawk pki compose-bundles DIR --model M`: everything one Compose host needs, from the operator's
PKI, so that no container ever holds the root key.

    DIR/nats/nats-auth.conf          nats-server's operator and accounts (JWTs), included by
                                     single.conf
    DIR/nats/nats-tls.conf           its TLS, also included: server.pem and server-key.pem (a
                                     certificate from the bus CA naming nats, the host, localhost
                                     and 127.0.0.1) and ca.pem, beside it
    DIR/coordinator/pki/             the coordinator's certificate bundle (`pki issue`)
    DIR/coordinator/nats.creds       and its own NATS user (`bus_identity`: scoped to its id)
    DIR/gateway/{pki/,nats.creds}    the gateway's, bound to the model
    DIR/shard-node/{pki/,nats.creds} the shard node's, bound to the model (it holds the sealing key)
    DIR/telemetry/nats.creds         telemetry reads the bus only
    DIR/telemetry/root.pub           and verifies plans and heartbeats against the root (no key)
    DIR/<service>/nats-ca.pem        every service's trust in NATS: the bus CA (MOHAWK_NATS_TLS_CA)
    DIR/gateway/redis-password       the cluster's Redis password (MOHAWK_REDIS_PASSWORD_FILE)
    DIR/redis/redis.conf             Redis's config (a compose secret): `requirepass` with it, and
                                     TLS only, with server.pem and server-key.pem beside it (a
                                     certificate from the bus CA naming redis, the host, localhost
                                     and 127.0.0.1), which gateways verify with nats-ca.pem

docker-compose.yml mounts DIR/<service> read-only into that service alone, as /pki. The NATS
operator and account are made once per cluster under <pki-dir>/nats-auth (kept on later runs), so
every host's users are signed by the same account (and `mohawk pki revoke` revokes them), each
user new on every run and named as its process; the bus CA (<pki-dir>/nats-tls, `nats_tls`; its
key stays there) is made once too, as is the Redis password (<pki-dir>/redis-password: a second
host's gateway reaches the first host's Redis with it); the certificates are new on every run.
Node ids are `<host>-<service>`, the ids docker-compose.yml gives the services with MOHAWK_HOST_ID.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from mohawk_cli.bus_identity import BUS_CREDS, bus_auth, issue_bus_user
from mohawk_cli.redis_server import ensure_password
from mohawk_common.bus.nats_auth import CONF_NAME, EVENTS_USER, issue_user
from mohawk_common.bus.nats_tls import LOCAL_HOSTS, ServerTls, init_ca, issue_server, issue_server_certificate
from mohawk_common.private_files import write_new
from mohawk_pqc.pki_files import issue_node, load_root_key

BUNDLE_DIR = "pki"
CREDS_FILE = BUS_CREDS
NATS_CA_FILE = "nats-ca.pem"
EVENTS_CREDS_FILE = "events.creds"  # the coordinator's: the servers' disconnect advisories
REDIS_PASSWORD_FILE = "redis-password"
REDIS_CONF_FILE = "redis.conf"
REDIS_SERVICE = "redis"  # its name on the compose network: what the gateways' rediss:// URL says
REDIS_SEEN_AT = "/etc/redis/tls"  # where docker-compose.yml mounts DIR/redis in the redis container
ROOT_PUBLIC_FILE = "root.pub"
NATS_SERVICE = "nats"  # its name on the compose network: what the services' tls:// URL says
NATS_SEEN_AT = "/etc/nats/auth"  # where docker-compose.yml mounts DIR/nats in the nats container


@dataclass(frozen=True, slots=True)
class ComposeService:
    """One Compose service: its certificate role (None: it needs no certificate) and NATS role."""

    name: str
    cert_role: str | None
    nats_role: str


SERVICES = (
    ComposeService("coordinator", "coordinator", "coordinator"),
    ComposeService("gateway", "gateway", "gateway"),
    ComposeService("shard-node", "shard", "shard"),
    ComposeService("telemetry", None, "telemetry"),
)


def node_id(host: str, service: str) -> str:
    return f"{host}-{service}"


def write_compose_bundles(
    pki: Path, out: Path, *, host: str, model: str, days: float = 365.0
) -> dict[str, Path]:
    """Issue and copy one bundle and one NATS credential per service of `host` into `out`.

    Returns {service (and "nats"): its directory}. The root must exist (`mohawk pki init`).
    """
    load_root_key(pki)  # no root: say so before anything is written
    auth = bus_auth(pki)
    ca = init_ca(pki)
    written = {"nats": _fresh_dir(out / "nats")}
    _copy_private(auth.conf, written["nats"] / CONF_NAME)
    issue_server(ca, written["nats"], (NATS_SERVICE, host, *LOCAL_HOSTS), days=days, seen_at=NATS_SEEN_AT)
    for service in SERVICES:
        target = written[service.name] = _fresh_dir(out / service.name)
        if service.cert_role is not None:
            bundle = issue_node(
                pki, node_id(host, service.name), service.cert_role, models=(model,), days=days
            )
            creds = issue_bus_user(auth, bundle, models=(model,))
            shutil.copytree(bundle, target / BUNDLE_DIR)  # modes kept: node.key and seal keys 0600
        else:  # a reader of signed control records: the root's public keys are all it needs
            shutil.copyfile(pki / ROOT_PUBLIC_FILE, target / ROOT_PUBLIC_FILE)
            name = node_id(host, service.name)
            creds = issue_user(auth, name, service.nats_role, auth.creds(name))
        _copy_private(creds, target / CREDS_FILE)
        _copy_private(ca.cert, target / NATS_CA_FILE)
        if service.name == "coordinator":
            _copy_private(auth.creds(EVENTS_USER), target / EVENTS_CREDS_FILE)
    password = ensure_password(pki / REDIS_PASSWORD_FILE)
    write_new(written["gateway"] / REDIS_PASSWORD_FILE, password + "\n")
    written["redis"] = _fresh_dir(out / "redis")
    tls = issue_server_certificate(ca, written["redis"], (REDIS_SERVICE, host, *LOCAL_HOSTS), days=days)
    write_new(written["redis"] / REDIS_CONF_FILE, redis_conf(password, tls))
    return written


def redis_conf(password: str, tls: ServerTls) -> str:
    """Redis's config for compose: its password, and TLS only on 6379 with the files `tls` wrote,
    as the container finds them (REDIS_SEEN_AT)."""
    seen = Path(REDIS_SEEN_AT)
    return (
        "# Generated by `mohawk pki compose-bundles`: Redis's password and TLS (a compose secret).\n"
        f'requirepass "{password}"\n'
        "port 0\n"
        "tls-port 6379\n"
        f"tls-cert-file {seen / tls.cert.name}\n"
        f"tls-key-file {seen / tls.key.name}\n"
        f"tls-ca-cert-file {seen / tls.ca.name}\n"
        "tls-auth-clients no\n"
    )


def _fresh_dir(path: Path) -> Path:
    """`path`, emptied: a re-run leaves no file of an earlier bundle behind."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, mode=0o700)
    return path


def _copy_private(source: Path, target: Path) -> None:
    """A copy of `source` that is 0600 from its creation (the target is new: `_fresh_dir`)."""
    write_new(target, source.read_bytes())
