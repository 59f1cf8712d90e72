"""The operator's PKI on disk: `mohawk pki init|issue|revoke`, and what a service loads at start.

    <pki>/root.key            the root's private keys (0600; keep it offline in production)
    <pki>/root.pub            the root's public keys: the trust anchor every node gets
    <pki>/crl                 the newest signed revocation list
    <pki>/serials             every serial issued, one per line
    <pki>/seal/<model>.{cert,key}   a model's request-sealing key (stage 0 opens requests with it)
    <pki>/seal/<model>.record       the newest signed record of it, after a rotation (`rotate_seal_key`)
    <pki>/nodes/<node>/       one node's bundle, all it needs: root.pub, node.cert, node.key (0600),
                              crl, seal/<model>.cert (and seal/<model>.key for shard nodes)

A bundle directory is what `MOHAWK_PKI_DIR` names for a service. Private keys are written 0600 and
never leave the machine they were issued on unless the operator copies the bundle.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from mohawk_pqc.certificates import (
    ROLES,
    Root,
    TrustStore,
    check_model,
    issue_certificate,
    read_body,
    root_public,
    sign_revocation_list,
)
from mohawk_pqc.errors import AuthenticationError, PkiError
from mohawk_pqc.identity import Identity, KemKeyPair, certificate_body_for
from mohawk_pqc.kem import KemProvider
from mohawk_pqc.seal_keys import SealKeyring, open_seal_key_copy, sign_seal_key_record, verify_seal_key_record
from mohawk_pqc.signing import SigningKey
from mohawk_proto.v1 import security_pb2

M = TypeVar("M", bound=Message)

DAY_S = 86400.0
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _write(path: Path, message: Message, *, private: bool = False) -> None:
    """Write `message` to `path` through a fresh `.tmp` beside it, renamed into place; a private
    key is mode 0600 whatever the umask and whatever was there. A leftover `.tmp` (an interrupted
    write, or a link someone planted) is removed, never reused: opening it would keep its mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        if private:
            os.fchmod(f.fileno(), 0o600)  # before a byte of the key is written
        f.write(message.SerializeToString(deterministic=True))
    tmp.replace(path)


def read_message(path: Path, cls: type[M]) -> M:
    """A protobuf file of the PKI; PkiError naming the file when it is missing or unreadable."""
    try:
        return cls.FromString(path.read_bytes())
    except FileNotFoundError as exc:
        raise PkiError(f"{path} is missing (run `mohawk pki init` first?)") from exc
    except (OSError, DecodeError) as exc:
        raise PkiError(f"{path} cannot be read as a {cls.__name__}: {exc}") from exc


MODEL_BOUND_ROLES = ("shard", "gateway")  # certificates that name the one model their node serves


def _seal_name(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in model.lower())


def init_pki(pki: Path, *, force: bool = False) -> Root:
    """Create the operator root (ECDSA P-256 + ML-DSA-65) and an empty revocation list."""
    if (pki / "root.key").exists() and not force:
        raise PkiError(f"{pki / 'root.key'} exists; pass --force to replace the root (all certificates die)")
    key = SigningKey.generate()
    bundle = security_pb2.PrivateKeyBundle(ecdsa_p256_private=key.ecdsa_pkcs8, mldsa65_seed=key.mldsa_seed)
    _write(pki / "root.key", bundle, private=True)
    root = Root(root_public(key))
    _write(pki / "root.pub", root.public)
    _write(pki / "crl", sign_revocation_list(key, 1, [], time.time()))
    return root


def load_root_key(pki: Path) -> SigningKey:
    bundle = read_message(pki / "root.key", security_pb2.PrivateKeyBundle)
    return SigningKey.from_private_bytes(bundle.ecdsa_p256_private, bundle.mldsa65_seed)


def _new_serial(pki: Path) -> int:
    serial = secrets.randbits(63) | 1
    with (pki / "serials").open("a", encoding="utf-8") as f:
        f.write(f"{serial}\n")
    return serial


def _issue(
    pki: Path, node_id: str, role: str, days: float, *, model: str = "", not_before: float | None = None
) -> Identity:
    root_key = load_root_key(pki)
    signing, kem = SigningKey.generate(), KemKeyPair.generate()
    start = time.time() - 60 if not_before is None else not_before
    body = certificate_body_for(
        node_id,
        role,
        signing,
        kem,
        serial=_new_serial(pki),
        not_before=start,
        not_after=start + days * DAY_S,
        model=model,
    )
    return Identity(issue_certificate(root_key, body), signing, kem)


def ensure_seal_key(pki: Path, model: str, days: float = 365.0) -> Path:
    """The model's request-sealing key pair under <pki>/seal/, created on first use."""
    base = pki / "seal" / _seal_name(model)
    if not base.with_suffix(".cert").exists():
        identity = _issue(pki, f"seal-{_seal_name(model)}", "seal", days, model=model)
        _write(base.with_suffix(".key"), identity.private_bundle(), private=True)
        _write(base.with_suffix(".cert"), identity.certificate)
    return base


def issue_node(
    pki: Path,
    node_id: str,
    role: str,
    *,
    models: tuple[str, ...] = (),
    days: float = 365.0,
    not_before: float | None = None,
) -> Path:
    """Issue a certificate for `node_id` and write its bundle to <pki>/nodes/<node_id>/.

    A shard or gateway certificate issued for exactly one of `models` is bound to it (`model`):
    that node serves that model only. Several models, or none, bind none (any model).
    """
    if role not in ROLES or role == "seal":
        raise PkiError(f"role must be one of shard, gateway, coordinator (got {role!r})")
    if not _NODE_ID.fullmatch(node_id):
        raise PkiError(f"node id {node_id!r} must be 1-128 characters of [A-Za-z0-9_-]")
    bound = models[0] if len(models) == 1 and role in MODEL_BOUND_ROLES else ""
    identity = _issue(pki, node_id, role, days, model=bound, not_before=not_before)
    out = pki / "nodes" / node_id
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "node.cert", identity.certificate)
    _write(out / "node.key", identity.private_bundle(), private=True)
    shutil.copyfile(pki / "root.pub", out / "root.pub")
    shutil.copyfile(pki / "crl", out / "crl")
    for model in models:
        base = ensure_seal_key(pki, model)
        (out / "seal").mkdir(exist_ok=True)
        shutil.copyfile(base.with_suffix(".cert"), out / "seal" / f"{base.name}.cert")
        if role == "shard":  # only the model's shard nodes (its possible stage 0s) may open requests
            seal_key = read_message(base.with_suffix(".key"), security_pb2.PrivateKeyBundle)
            _write(out / "seal" / f"{base.name}.key", seal_key, private=True)  # 0600 from its creation
    return out


def revoke(pki: Path, serials: list[int]) -> security_pb2.RevocationList:
    """Sign the next revocation list (the old serials plus `serials`) and write it to <pki>/crl."""
    root_key = load_root_key(pki)
    old = read_message(pki / "crl", security_pb2.RevocationList)
    body = security_pb2.RevocationListBody.FromString(old.body)
    crl = sign_revocation_list(root_key, body.number + 1, [*body.serials, *serials], time.time())
    _write(pki / "crl", crl)
    return crl


def load_operator_trust(pki: Path) -> TrustStore:
    """The root of `pki` and its newest revocation list, as the operator's own checks use them."""
    trust = TrustStore(Root(read_message(pki / "root.pub", security_pb2.RootPublicKey)))
    try:
        trust.update_revocations(read_message(pki / "crl", security_pb2.RevocationList))
    except AuthenticationError as exc:
        raise PkiError(f"{pki / 'crl'} is not signed by the root in {pki / 'root.pub'}") from exc
    return trust


def seal_models(pki: Path) -> list[str]:
    """Every model that has a request-sealing key under <pki>/seal/."""
    paths = sorted((pki / "seal").glob("*.cert"))
    return [read_body(read_message(path, security_pb2.Certificate)).model for path in paths]


def seal_models_due(pki: Path, every_days: float, now: float | None = None) -> list[str]:
    """The models whose request-sealing key was issued `every_days` or more ago (`now`: unix seconds,
    default the clock's): those a rotation schedule rotates next."""
    now = time.time() if now is None else now
    due = []
    for path in sorted((pki / "seal").glob("*.cert")):
        body = read_body(read_message(path, security_pb2.Certificate))
        if now - body.not_before >= every_days * DAY_S:
            due.append(body.model)
    return due


def models_held_by(pki: Path, serials: list[int]) -> list[str]:
    """The models whose sealing private key the certificates `serials` were given: those in each
    one's shard bundle; every model when a serial's bundle is not under <pki>/nodes. Gateways and
    coordinators never hold one."""
    held: set[str] = set()
    bundles = {
        read_body(read_message(p, security_pb2.Certificate)).serial: p.parent for p in _node_certs(pki)
    }
    for serial in serials:
        out = bundles.get(serial)
        if out is None:
            return seal_models(pki)
        for key_path in (out / "seal").glob("*.key"):
            held.add(read_body(read_message(key_path.with_suffix(".cert"), security_pb2.Certificate)).model)
    return sorted(held)


def seal_record_number(pki: Path, model: str) -> int:
    """The number of `model`'s newest sealing-key record on disk; 0 before its first rotation."""
    path = (pki / "seal" / _seal_name(model)).with_suffix(".record")
    if not path.exists():
        return 0
    record = read_message(path, security_pb2.SealKeyRecord)
    return security_pb2.SealKeyRecordBody.FromString(record.body).number


def rotate_seal_key(
    pki: Path, model: str, *, number: int, kem: KemProvider, days: float = 365.0
) -> security_pb2.SealKeyRecord:
    """A new request-sealing key for `model`, and record `number` that carries it to the shard nodes.

    The recipients are the shard bundles under <pki>/nodes that hold the model's current key and
    whose certificate is valid now (not revoked, not expired, bound to no other model). The key is
    written to <pki>/seal/ (bundles issued from now on get it) and into the valid bundles that hold
    the old one; a revoked node's bundle is left as it was.
    """
    trust, name = load_operator_trust(pki), _seal_name(model)
    holders: list[tuple[Path, security_pb2.CertificateBody]] = []
    for cert_path in _node_certs(pki):
        if (cert_path.parent / "seal" / f"{name}.cert").exists():
            try:
                body = trust.verify(read_message(cert_path, security_pb2.Certificate))
                check_model(body, model)
            except AuthenticationError:
                continue
            holders.append((cert_path.parent, body))
    recipients = [body for out, body in holders if (out / "seal" / f"{name}.key").exists()]
    identity = _issue(pki, f"seal-{name}", "seal", days, model=model)
    record = sign_seal_key_record(
        load_root_key(pki), identity, recipients, kem, number=number, now=time.time()
    )
    base = pki / "seal" / name
    for out in [base.parent, *(out / "seal" for out, _ in holders)]:
        _write(out / f"{name}.cert", identity.certificate)
        if out == base.parent or (out / f"{name}.key").exists():
            _write(out / f"{name}.key", identity.private_bundle(), private=True)
    _write(base.with_suffix(".record"), record)
    return record


def _node_certs(pki: Path) -> list[Path]:
    return sorted((pki / "nodes").glob("*/node.cert"))


@dataclass
class Bundle:
    """What a service loads from its bundle directory."""

    identity: Identity
    trust: TrustStore
    seal_keyrings: dict[str, SealKeyring] = field(default_factory=dict)

    def seal_keyring_for(self, model: str) -> SealKeyring | None:
        return self.seal_keyrings.get(_seal_name(model))

    def seal_cert_for(self, model: str) -> security_pb2.Certificate | None:
        """The newest sealing certificate of `model` (what requests are sealed to now)."""
        keyring = self.seal_keyring_for(model)
        return None if keyring is None else keyring.certificate

    def seal_key_for(self, model: str) -> KemKeyPair | None:
        """The newest sealing private key of `model` (shard nodes only)."""
        keyring = self.seal_keyring_for(model)
        return None if keyring is None else keyring.keys

    def adopt_seal_key_record(self, record: security_pb2.SealKeyRecord, *, now: float, keep_s: float) -> bool:
        """Follow a rotation of a model's sealing key: True when `record` took effect; False for a
        model this node holds no sealing key of, or the record held now. AuthenticationError, and
        nothing changes, for a record the root did not sign, an older one, or, on a node that opens
        requests, one without a copy for it."""
        body = verify_seal_key_record(record, self.trust)
        keyring = self.seal_keyring_for(body.model)
        if keyring is None or not keyring.is_newer(body):
            return False
        keys = open_seal_key_copy(body, self.identity) if keyring.keys is not None else None
        keyring.adopt(body, keys, now=now, keep_s=keep_s)
        return True


def load_bundle(path: Path, *, role: str) -> Bundle:
    """Load and check a node bundle: its own certificate must be valid now, for `role`."""
    root = read_message(path / "root.pub", security_pb2.RootPublicKey)
    trust = TrustStore(Root(root))
    if (path / "crl").exists():
        try:
            trust.update_revocations(read_message(path / "crl", security_pb2.RevocationList))
        except AuthenticationError as exc:
            raise PkiError(f"{path / 'crl'} is not signed by this root") from exc
    cert = read_message(path / "node.cert", security_pb2.Certificate)
    try:
        body = trust.verify(cert, role=role)
    except AuthenticationError as exc:
        raise PkiError(
            f"{path / 'node.cert'} is not a valid {role} certificate: {exc.reason} ({exc.detail})"
        ) from exc
    bundle = Bundle(_matching_identity(path, cert, body), trust)
    for cert_path in sorted((path / "seal").glob("*.cert")):
        seal_cert = read_message(cert_path, security_pb2.Certificate)
        try:
            trust.verify(seal_cert, role="seal")
        except AuthenticationError as exc:
            raise PkiError(f"{cert_path} is not a valid sealing certificate: {exc.reason}") from exc
        key_path = cert_path.with_suffix(".key")
        keys = _seal_pair(key_path, read_body(seal_cert)) if key_path.exists() else None
        bundle.seal_keyrings[cert_path.stem] = SealKeyring(seal_cert, keys)
    return bundle


def _matching_identity(
    path: Path, cert: security_pb2.Certificate, body: security_pb2.CertificateBody
) -> Identity:
    """The identity from node.key, which must hold the private half of every key in the certificate."""
    key = read_message(path / "node.key", security_pb2.PrivateKeyBundle)
    try:
        identity = Identity.from_files(cert, key)
    except ValueError as exc:
        raise PkiError(f"{path / 'node.key'} holds no usable private keys: {exc}") from exc
    verify, kem = identity.signing_key.verify_key(), identity.kem_keys
    held = (verify.ecdsa_public, verify.mldsa_public, kem.x25519_public, kem.mlkem_public)
    if held != (body.ecdsa_p256_public, body.mldsa65_public, body.x25519_public, body.mlkem768_public):
        raise PkiError(f"{path / 'node.key'} does not belong to {path / 'node.cert'}")
    return identity


def _seal_pair(path: Path, certified: security_pb2.CertificateBody) -> KemKeyPair:
    """A sealing key pair, which must be the one `certified` names."""
    key = read_message(path, security_pb2.PrivateKeyBundle)
    try:
        pair = KemKeyPair.from_private_bytes(key.x25519_private, key.mlkem768_seed)
    except ValueError as exc:
        raise PkiError(f"{path} holds no usable private keys: {exc}") from exc
    if (pair.x25519_public, pair.mlkem_public) != (certified.x25519_public, certified.mlkem768_public):
        raise PkiError(f"{path} does not belong to the sealing certificate beside it")
    return pair


def describe(cert: security_pb2.Certificate) -> str:
    body = read_body(cert)
    return (
        f"{body.node_id} role={body.role} serial={body.serial} "
        f"valid {time.strftime('%Y-%m-%d', time.gmtime(body.not_before))}.."
        f"{time.strftime('%Y-%m-%d', time.gmtime(body.not_after))}"
        + (f" model={body.model}" if body.model else "")
    )


def ensure_dev_bundle(pki: Path, node_id: str, role: str, models: tuple[str, ...]) -> Path:
    """Development PKI: the bundle of `node_id` under `pki`, issued now (root created if missing).

    For one-host setups (docker compose on a laptop) where every process shares `pki`; it holds the
    root key, so production issues bundles offline with `mohawk pki issue` instead. A file lock
    keeps processes starting together from creating two roots."""
    import fcntl

    pki.mkdir(parents=True, exist_ok=True)
    with (pki / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (pki / "root.key").exists():
            init_pki(pki)
        bundle = pki / "nodes" / node_id
        if not (bundle / "node.cert").exists():
            issue_node(pki, node_id, role, models=models, days=30)
        return bundle
