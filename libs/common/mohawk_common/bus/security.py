"""A process's security state: its certificate bundle, its ML-KEM provider, what it has rejected.

Every Mohawk service builds one `Security` at start. Without a valid certificate bundle the
process refuses to start, unless it runs with `insecure` set, in which case it says loudly, once
at start and in every heartbeat, that its bus traffic is plaintext. A secure process never accepts
plaintext from the bus where it expects ciphertext. Rejections are logged with their reason and
counted by reason (`rejections`), which heartbeats and /metrics report. The KV bucket `mohawk_pki`
is followed: a newer revocation list signed by the root takes effect at once, and so does a newer
sealing-key record of a model this process seals or opens requests of (`mohawk_pqc.seal_keys`):
gateways seal to its certificate from then on, shard nodes open with its key and keep the one it
replaces for `SEALED_REQUEST_LIFETIME_S`, the longest a request sealed to that one can live.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import structlog
from google.protobuf.message import DecodeError
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.config import BUNDLE_CREDS, BusSettings
from mohawk_common.bus.nats_auth import CONF_NAME, NatsAuth, issue_user
from mohawk_common.errors import ConfigError
from mohawk_pqc.certificates import check_model
from mohawk_pqc.errors import AuthenticationError, PkiError
from mohawk_pqc.kem import KemProvider, load_kem_provider
from mohawk_pqc.pki_files import Bundle, ensure_dev_bundle, load_bundle
from mohawk_proto.v1 import security_pb2

log = structlog.get_logger("mohawk.security")

INSECURE_WARNING = "INSECURE MODE: no certificate, bus traffic (prompts, activations, tokens) is PLAINTEXT"
# The longest a sealed request lives: its deadline is the gateway's request_timeout_s (default 600 s)
# after it was sealed, and stage 0 refuses it after that (`requests.check_fresh`). A rotated-out
# sealing key is kept this long after the rotation reaches a shard node, then dropped.
SEALED_REQUEST_LIFETIME_S = 600.0


class Security:
    def __init__(
        self, bundle: Bundle | None, kem: KemProvider, *, role: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.bundle = bundle
        self.kem = kem
        self.role = role
        self.clock = clock  # unix seconds: when a rotated-out sealing key lapses
        self.seal_key_keep_s = SEALED_REQUEST_LIFETIME_S
        self.rejections: Counter[str] = Counter()
        self.on_reject: Callable[[str], None] | None = None

    @property
    def secure(self) -> bool:
        return self.bundle is not None

    @classmethod
    def load(
        cls, *, role: str, bundle_dir: Path, insecure: bool, kem_provider: str = "cryptography"
    ) -> Security:
        """The bundle at `bundle_dir`, checked; ConfigError (refuse to start) unless `insecure`."""
        try:
            kem = load_kem_provider(kem_provider)
        except PkiError as exc:
            raise ConfigError(str(exc)) from exc
        if insecure:
            log.warning(INSECURE_WARNING, role=role)
            return cls(None, kem, role=role)
        try:
            bundle = load_bundle(bundle_dir, role=role)
        except PkiError as exc:
            raise ConfigError(
                f"no valid {role} certificate: {exc}. Issue one with `mohawk pki issue`, point "
                "MOHAWK_PKI_DIR at its bundle, or run with --insecure for development"
            ) from exc
        log.info("certificate loaded", role=role, node=bundle.identity.node_id, kem=kem.name)
        return cls(bundle, kem, role=role)

    @classmethod
    def for_service(
        cls, settings: BusSettings, *, role: str, process_id: str, models: tuple[str, ...] = ()
    ) -> Security:
        """What a service starts with: its bundle (self-issued from `dev_pki_dir` in development)."""
        bundle_dir = settings.bundle_dir(process_id)
        if settings.pki_dir is None and settings.dev_pki_dir is not None and not settings.insecure:
            try:
                bundle_dir = ensure_dev_bundle(settings.dev_pki_dir, process_id, role, models)
                ensure_dev_bus_user(settings.dev_pki_dir, bundle_dir, process_id, role, models)
            except (OSError, PkiError, ValueError) as exc:
                raise ConfigError(f"development PKI at {settings.dev_pki_dir} unusable: {exc}") from exc
            log.warning(
                "DEVELOPMENT PKI: issued this process its own certificate from a shared root; "
                "in production issue bundles with `mohawk pki issue` and mount only the bundle",
                pki=str(settings.dev_pki_dir),
            )
        security = cls.load(
            role=role, bundle_dir=bundle_dir, insecure=settings.insecure, kem_provider=settings.kem_provider
        )
        security.check_serves(models)
        return security

    def check_serves(self, models: tuple[str, ...]) -> None:
        """ConfigError (refuse to start) when this process's certificate is bound to a model other
        than one of `models` it would serve; a certificate naming no model serves any."""
        if self.bundle is None:
            return
        body = self.bundle.identity.body
        for model in models:
            try:
                check_model(body, model)
            except AuthenticationError as exc:
                raise ConfigError(
                    f"{exc.detail}: a {self.role} certificate serves only its model; issue one for "
                    f"{model!r} (mohawk pki issue --model {model})"
                ) from exc

    def reject(self, exc: AuthenticationError, **context: object) -> None:
        """Log and count one rejected message, handshake or package."""
        self.rejections[exc.reason] += 1
        log.warning("rejected", reason=exc.reason, detail=exc.detail, **context)
        if self.on_reject is not None:
            self.on_reject(exc.reason)

    def require(self) -> Bundle:
        if self.bundle is None:
            raise ConfigError("this operation needs a certificate; the process runs insecure")
        return self.bundle

    async def follow_revocations(self, kv: KeyValue) -> None:
        """Follow mohawk_pki (runs until cancelled): adopt every newer root-signed revocation list
        (key `crl`) and sealing-key record (`seal.<model>`)."""
        if self.bundle is None:
            return
        while True:
            try:
                watcher = await kv.watch(names.PKI_WILDCARD)
                async for entry in watcher:
                    if entry is None or not entry.value:
                        continue
                    is_crl = entry.key == names.CRL_KEY
                    try:
                        if is_crl:
                            self._adopt_revocations(entry.value)
                        elif entry.key.startswith(names.SEAL_KEY_PREFIX):
                            self.adopt_seal_key(entry.value)
                    except AuthenticationError as exc:
                        self.reject(exc, what="revocation list" if is_crl else "sealing-key record")
                    except Exception as exc:
                        log.warning("unreadable PKI record ignored", key=entry.key, error=str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("PKI watch lost, retrying", error=str(exc))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(1.0)

    def _adopt_revocations(self, data: bytes) -> None:
        trust = self.require().trust
        if trust.update_revocations(security_pb2.RevocationList.FromString(data)):
            log.info("revocation list adopted", number=trust.crl_number, revoked=len(trust.revoked))

    def adopt_seal_key(self, data: bytes) -> bool:
        """Adopt a sealing-key record read off the bus; True when it took effect. AuthenticationError
        for one not signed by the root, older than the one held, or without this node's copy."""
        try:
            record = security_pb2.SealKeyRecord.FromString(data)
        except DecodeError as exc:
            raise AuthenticationError("malformed", "sealing-key record") from exc
        bundle = self.require()
        if not bundle.adopt_seal_key_record(record, now=self.clock(), keep_s=self.seal_key_keep_s):
            return False
        body = security_pb2.SealKeyRecordBody.FromString(record.body)
        log.info("sealing key rotated", model=body.model, number=body.number, role=self.role)
        return True


def ensure_dev_bus_user(
    dev_pki: Path, bundle_dir: Path, process_id: str, role: str, models: tuple[str, ...]
) -> None:
    """Development PKI: where the shared directory also holds a NATS operator (`mohawk pki
    nats-auth DIR`: docker-compose.dev.yml's), this process's own NATS user in its bundle, issued
    now (under a lock: processes starting together append to one ledger)."""
    creds = bundle_dir / BUNDLE_CREDS
    if not (dev_pki / CONF_NAME).is_file() or creds.is_file():
        return
    with (dev_pki / ".nats-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not creds.is_file():
            issue_user(NatsAuth(dev_pki), process_id, role, creds, models=models)
