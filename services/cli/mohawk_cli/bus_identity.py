"""A node's bus identity, issued beside its certificate: `mohawk pki issue`, `mohawk up`, the compose
bundles and the multihost hosts all issue a process's NATS user here.

The operator's NATS keys live under `<pki-dir>/nats-auth` (`mohawk_common.bus.nats_auth`), beside
the root, so `mohawk pki revoke` finds the users a revoked certificate went with: each user is
entered in that directory's ledger with its certificate's serial, and expires with it. The user
is written as `nats.creds` into the node's bundle (`<pki-dir>/nodes/<id>/`), scoped to the node's
id and, for a shard node, its certificate's models (`nats_permissions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mohawk_common.bus.config import BUNDLE_CREDS
from mohawk_common.bus.nats_auth import NatsAuth, init_auth, issue_user
from mohawk_pqc.pki_files import issue_node, read_body, read_message
from mohawk_proto.v1 import security_pb2

NATS_AUTH_DIR = "nats-auth"  # under the PKI directory: the cluster's NATS keys and users
BUS_CREDS = BUNDLE_CREDS  # in a node's bundle: its own NATS user (what a service connects as)


def bus_auth(pki: Path) -> NatsAuth:
    """The PKI's NATS operator and account (made on first use, kept after)."""
    return init_auth(Path(pki) / NATS_AUTH_DIR)


def issue_with_identity(
    pki: Path, node_id: str, role: str, *, models: Sequence[str] = (), days: float = 365.0
) -> Path:
    """A certificate bundle for `node_id` (`issue_node`) and its NATS user in it; the bundle's dir."""
    bundle = issue_node(pki, node_id, role, models=tuple(models), days=days)
    issue_bus_user(bus_auth(pki), bundle, models=models)
    return bundle


def issue_bus_user(auth: NatsAuth, bundle: Path, *, models: Sequence[str] = ()) -> Path:
    """The NATS user of the node whose certificate is in `bundle`: named and scoped as it, entered
    with its serial, expiring with it; written to `bundle/nats.creds`."""
    body = read_body(read_message(bundle / "node.cert", security_pb2.Certificate))
    return issue_user(
        auth,
        body.node_id,
        body.role,
        bundle / BUS_CREDS,
        models=tuple(models) if body.role == "shard" else (),
        serial=int(body.serial),
        expires_at=int(body.not_after),
    )
