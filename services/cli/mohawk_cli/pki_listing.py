"""What an operator's PKI directory holds, as `mohawk pki show` lists it and `revoke` checks it.

Design. The listing trusts nothing it reads: the revocation list must be signed by the root in
`root.pub` (else `PkiError`), and every certificate found (node bundles under `nodes/`, sealing
certificates under `seal/`) is verified against that root and list now, so each line says whether
the root still vouches for it, or why not (`[revoked]`, `[expired]`, ...); an unreadable file is a
line of its own, never the end of the listing. `issued_serials` reads the `serials` file the
issuer appends to, so `revoke` refuses a serial this directory never issued.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mohawk_pqc.certificates import Root, TrustStore
from mohawk_pqc.errors import AuthenticationError, PkiError
from mohawk_pqc.pki_files import describe, read_message
from mohawk_proto.v1 import security_pb2

FINGERPRINT_BYTES = 16


def fingerprint(issuer: bytes) -> str:
    """How a root is shown: the first `FINGERPRINT_BYTES` of its issuer id, in hex."""
    return issuer[:FINGERPRINT_BYTES].hex()


def listing(pki: Path) -> Iterator[str]:
    """The root, the revocation list and every certificate issued, one line each."""
    trust = TrustStore(Root(read_message(pki / "root.pub", security_pb2.RootPublicKey)))
    crl = read_message(pki / "crl", security_pb2.RevocationList)
    try:
        trust.update_revocations(crl)
    except AuthenticationError as exc:
        raise PkiError(f"{pki / 'crl'} is not signed by the root in {pki / 'root.pub'}") from exc
    revoked = ", ".join(map(str, sorted(trust.revoked))) or "none"
    yield f"root {fingerprint(trust.root.issuer)}  ({pki})"
    yield f"revocation list {trust.crl_number}: revoked serials {revoked}"
    certs = sorted((pki / "nodes").glob("*/node.cert")) + sorted((pki / "seal").glob("*.cert"))
    if not certs:
        yield "no certificates issued yet"
    for path in certs:
        yield f"{'node' if path.name == 'node.cert' else 'seal'} {_status(trust, path)}"


def _status(trust: TrustStore, path: Path) -> str:
    """One certificate as `describe` puts it, and whether the root still vouches for it now."""
    try:
        cert = read_message(path, security_pb2.Certificate)
        text = describe(cert)
    except (PkiError, AuthenticationError) as exc:
        return f"{path}: unreadable ({exc})"
    try:
        trust.verify(cert)
    except AuthenticationError as exc:
        return f"{text} [{exc.reason}]"
    return f"{text} [ok]"


def issued_serials(pki: Path) -> set[int]:
    """Every serial this directory issued (none before the first)."""
    try:
        return {int(line) for line in (pki / "serials").read_text(encoding="utf-8").split()}
    except FileNotFoundError:
        return set()
    except ValueError as exc:
        raise PkiError(f"{pki / 'serials'} holds something other than serial numbers") from exc
