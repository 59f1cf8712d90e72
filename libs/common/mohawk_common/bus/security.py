"""A process's security state: its certificate bundle, its ML-KEM provider, what it has rejected.

Every Mohawk service builds one `Security` at start. Without a valid certificate bundle the
process refuses to start, unless it runs with `insecure` set, in which case it says loudly, once
at start and in every heartbeat, that its bus traffic is plaintext. A secure process never accepts
plaintext from the bus where it expects ciphertext. Rejections are logged with their reason and
counted by reason (`rejections`), which heartbeats and /metrics report. The revocation list is
followed from the KV bucket `mohawk_pki`: a newer list signed by the root takes effect at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import structlog
from nats.js.kv import KeyValue

from mohawk_common.bus import names
from mohawk_common.bus.config import BusSettings
from mohawk_common.errors import ConfigError
from mohawk_pqc.certificates import check_model
from mohawk_pqc.errors import AuthenticationError, PkiError
from mohawk_pqc.kem import KemProvider, load_kem_provider
from mohawk_pqc.pki_files import Bundle, ensure_dev_bundle, load_bundle
from mohawk_proto.v1 import security_pb2

log = structlog.get_logger("mohawk.security")

INSECURE_WARNING = "INSECURE MODE: no certificate, bus traffic (prompts, activations, tokens) is PLAINTEXT"


class Security:
    def __init__(self, bundle: Bundle | None, kem: KemProvider, *, role: str) -> None:
        self.bundle = bundle
        self.kem = kem
        self.role = role
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
            except (OSError, PkiError) as exc:
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
        """Adopt every newer root-signed revocation list put under mohawk_pki/crl (runs until cancelled)."""
        if self.bundle is None:
            return
        trust = self.bundle.trust
        while True:
            try:
                watcher = await kv.watch(names.CRL_KEY)
                async for entry in watcher:
                    if entry is None or not entry.value:
                        continue
                    try:
                        crl = security_pb2.RevocationList.FromString(entry.value)
                        if trust.update_revocations(crl):
                            log.info(
                                "revocation list adopted", number=trust.crl_number, revoked=len(trust.revoked)
                            )
                    except AuthenticationError as exc:
                        self.reject(exc, what="revocation list")
                    except Exception as exc:
                        log.warning("unreadable revocation list ignored", error=str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("revocation watch lost, retrying", error=str(exc))
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(1.0)
