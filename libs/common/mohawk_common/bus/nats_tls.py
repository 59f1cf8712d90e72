"""TLS on every NATS link: an X.509 CA for the bus, a certificate per nats-server, and the client's
`ssl.SSLContext` that verifies the server.

Mohawk's own root (`mohawk_pqc.pki_files`) is a hybrid ECDSA + ML-DSA PKI that nats-server cannot
read, so the bus has an X.509 CA of its own (ECDSA P-256), kept beside that root under the PKI dir:

    <pki>/nats-tls/ca.pem          the bus CA's certificate: clients trust it (MOHAWK_NATS_TLS_CA)
    <pki>/nats-tls/ca.key          its private key (0600); it stays with the operator, in no container

`issue_server(ca, dir, hosts)` writes what one nats-server needs into `dir`:

    server.pem, server-key.pem     its certificate (SANs: `hosts`) and key (0600); the certificate
                                   is good for serverAuth and clientAuth, as cluster routes use both
    ca.pem                         the CA, to verify route peers
    nats-tls.conf                  `tls {}` for clients, to include at the top level
    route-tls.conf                 `tls {}` for routes, to include inside `cluster {}`

`write_servers(pki, dir, servers)` does that for several servers at once (`mohawk pki nats-tls`:
config/nats/tls/nats-1 ... for the 3-server cluster). The key exchange is whatever Go's TLS and
the client's OpenSSL agree on (README "TLS on the bus" has what each link negotiates, measured).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mohawk_common.private_files import PRIVATE, PUBLIC, write_new

CA_DIR = "nats-tls"  # under the PKI dir
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"
CLIENT_CONF = "nats-tls.conf"
ROUTE_CONF = "route-tls.conf"
LOCAL_HOSTS = ("localhost", "127.0.0.1")
CA_DAYS = 3650.0
SERVER_DAYS = 365.0
CONTAINER_DIR = "/etc/nats/tls"  # where config/nats's compose files mount a server's directory
HANDSHAKE_TIMEOUT_S = 5  # nats-server's default, 0.5 s, is short for a loaded machine
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class NatsCa:
    dir: Path

    @property
    def cert(self) -> Path:
        return self.dir / CA_CERT

    @property
    def key(self) -> Path:
        return self.dir / CA_KEY


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A directory `issue_server` filled: one nats-server's certificate, key, CA and includes."""

    dir: Path

    @property
    def cert(self) -> Path:
        return self.dir / SERVER_CERT

    @property
    def key(self) -> Path:
        return self.dir / SERVER_KEY

    @property
    def ca(self) -> Path:
        return self.dir / CA_CERT

    @property
    def client_conf(self) -> Path:
        return self.dir / CLIENT_CONF

    @property
    def route_conf(self) -> Path:
        return self.dir / ROUTE_CONF


def init_ca(pki: Path, *, force: bool = False) -> NatsCa:
    """The bus CA under `pki`/nats-tls, made if it is not there yet (or `force`)."""
    ca = NatsCa(Path(pki) / CA_DIR)
    if ca.key.is_file() and ca.cert.is_file() and not force:
        return ca
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Mohawk NATS CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        _builder(name, name, key.public_key(), now, CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(ca.key, _key_pem(key))
    write_public(ca.cert, cert.public_bytes(serialization.Encoding.PEM))
    return ca


def issue_server(
    ca: NatsCa,
    out: Path,
    hosts: Sequence[str],
    *,
    days: float = SERVER_DAYS,
    seen_at: str | Path | None = None,
) -> ServerTls:
    """A certificate for a nats-server reached as any of `hosts` (DNS names or IP addresses), and
    its config includes, in `out`. `seen_at` is where that server finds `out` (a container's mount,
    e.g. /etc/nats/tls); default `out` itself."""
    server = issue_server_certificate(ca, out, hosts, days=days)
    where = Path(seen_at) if seen_at is not None else server.dir.resolve()
    write_public(server.client_conf, tls_block(where, comment="clients"))
    write_public(server.route_conf, tls_block(where, comment="cluster routes (verified both ways)"))
    return server


def issue_server_certificate(
    ca: NatsCa, out: Path, hosts: Sequence[str], *, days: float = SERVER_DAYS
) -> ServerTls:
    """A certificate from the bus CA for any server reached as one of `hosts` (nats-server, or
    Redis beside it): server.pem, server-key.pem (0600) and the CA's ca.pem, in `out`."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, days)
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in dict.fromkeys(hosts)]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    server = ServerTls(Path(out))
    server.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(server.key, _key_pem(key))
    write_public(server.cert, cert.public_bytes(serialization.Encoding.PEM))
    write_public(server.ca, ca.cert.read_bytes())
    return server


def tls_block(where: Path, *, comment: str) -> str:
    """nats-server's `tls {}` naming the files `issue_server` wrote, as found under `where`."""
    files = {"cert_file": SERVER_CERT, "key_file": SERVER_KEY, "ca_file": CA_CERT}
    lines = [f"  {k}: {json.dumps(str(where / v))}" for k, v in files.items()]
    return (
        f"# Generated by Mohawk (mohawk_common.bus.nats_tls): TLS for {comment}.\n"
        "tls {\n" + "\n".join(lines) + f"\n  timeout: {HANDSHAKE_TIMEOUT_S}\n}}\n"
    )


def client_context(ca_file: str | Path) -> ssl.SSLContext:
    """A client context that trusts only the bus CA `ca_file` and checks the server's name."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConnectionError(f"cannot read the NATS TLS CA {ca_file}: {exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    days: float,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_private(path: Path, data: bytes) -> None:
    """A new 0600 file whatever was there (a leftover file's mode, a planted link) and the umask."""
    write_new(path, data, PRIVATE)


def write_public(path: Path, data: bytes | str) -> None:
    write_new(path, data, PUBLIC)


def write_servers(
    pki: Path,
    out: Path,
    servers: Mapping[str, Sequence[str]],
    *,
    seen_at: str | Path | None = CONTAINER_DIR,
    days: float = SERVER_DAYS,
) -> dict[str, ServerTls]:
    """`out`/<name>/ for each server of `servers` (name -> other names and addresses it is reached
    at; localhost and 127.0.0.1 are added), from the bus CA under `pki` (made if absent). `seen_at`
    is where each server finds its directory (default: the cluster's compose mount); None: `out`."""
    ca = init_ca(pki)
    return {
        name: issue_server(
            ca,
            Path(out) / name,
            (name, *hosts, *LOCAL_HOSTS),
            days=days,
            seen_at=seen_at,
        )
        for name, hosts in servers.items()
    }
