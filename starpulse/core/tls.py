"""Mutual TLS between agents and the controller: settings, credentials, peer identity, a test CA.

Who a peer is (``peer_node_id``) is read from the client certificate the TLS handshake
verified, never from anything the peer says:

1. a URI SAN ``starpulse-node:<id>`` (exactly one; several is ambiguous and names nobody);
2. else a single DNS SAN;
3. else the subject common name (CN).

The candidate must also be a valid node id (``starpulse.core.names``); otherwise the peer has
no node identity and the controller refuses its reports. ``make_test_ca`` writes node
certificates carrying both the CN and the URI SAN.

All certificate files are PEM. Errors name the file that is missing, unreadable, not
PEM, or whose key does not belong to its certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from starpulse.core.names import InvalidName, validate_node_id
from starpulse.core.schema import ConfigError

NODE_URI_PREFIX = "starpulse-node:"
ADMIN_CERT_NAME = "admin"


class TLSConfigError(ConfigError):
    """A TLS file that is missing, unreadable or inconsistent; the message names the file."""


@dataclass(frozen=True)
class TLSSettings:
    """PEM files. The controller requires client certificates signed by ``ca_file``; the
    agent verifies the controller against the same CA. A node's certificate names its node
    id (see the module docstring for the rule), and the controller accepts reports only for
    that node."""

    ca_file: Path
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class TLSMaterial:
    """The PEM bytes of one side's TLS settings, checked."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def _read(path: Path, what: str) -> bytes:
    path = Path(path)
    if not path.exists():
        raise TLSConfigError(f"TLS {what} file {str(path)!r} does not exist")
    if not path.is_file():
        raise TLSConfigError(f"TLS {what} file {str(path)!r} is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"TLS {what} file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    if not data.strip():
        raise TLSConfigError(f"TLS {what} file {str(path)!r} is empty")
    return data


def load_material(settings: TLSSettings) -> TLSMaterial:
    """Read and check the three files: each parses as PEM, and the key belongs to the certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca_pem = _read(settings.ca_file, "CA")
    cert_pem = _read(settings.cert_file, "certificate")
    key_pem = _read(settings.key_file, "key")
    try:
        x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise TLSConfigError(f"TLS CA file {str(settings.ca_file)!r} is not a PEM certificate: {exc}") from exc
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as exc:
        raise TLSConfigError(
            f"TLS certificate file {str(settings.cert_file)!r} is not a PEM certificate: {exc}"
        ) from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TLSConfigError(
            f"TLS key file {str(settings.key_file)!r} is not an unencrypted PEM private key: {exc}"
        ) from exc
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise TLSConfigError(
            f"TLS key file {str(settings.key_file)!r} does not match certificate {str(settings.cert_file)!r}"
        )
    return TLSMaterial(ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem)


def load_server_credentials(settings: TLSSettings) -> grpc.ServerCredentials:
    """Server credentials that require a client certificate signed by the CA (mutual TLS)."""
    m = load_material(settings)
    return grpc.ssl_server_credentials([(m.key_pem, m.cert_pem)], root_certificates=m.ca_pem, require_client_auth=True)


def load_channel_credentials(settings: TLSSettings) -> grpc.ChannelCredentials:
    """Client credentials: verify the server against the CA and present our certificate."""
    m = load_material(settings)
    return grpc.ssl_channel_credentials(root_certificates=m.ca_pem, private_key=m.key_pem, certificate_chain=m.cert_pem)


def server_ssl_context(settings: TLSSettings, *, client_certs: bool) -> ssl.SSLContext:
    """An HTTPS server context on the same files as the gRPC side (checked first, so a bad file is
    named). ``client_certs``: ask for a client certificate and verify it against the CA when one
    is presented (optional: a browser without one still gets the page that says how to sign in)."""
    load_material(settings)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    if client_certs:
        ctx.load_verify_locations(cafile=str(settings.ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def node_id_from_peercert(cert: Mapping[str, Any] | None) -> str | None:
    """The identity of a client certificate Python's ``ssl`` verified (``getpeercert()``), by the
    same rule as ``peer_node_id``; None without a certificate."""
    if not cert:
        return None
    sans: list[tuple[str, str]] = list(cert.get("subjectAltName", ()))
    auth: dict[str, list[str]] = {
        "peer_uri": [v for k, v in sans if k == "URI"],
        "peer_dns": [v for k, v in sans if k == "DNS"],
        "x509_common_name": [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"],
    }
    return node_id_from_auth(auth)


def _strings(values: Iterable[bytes | str] | None) -> list[str]:
    out = []
    for v in values or ():
        out.append(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
    return out


def _valid(candidate: str) -> str | None:
    try:
        return validate_node_id(candidate)
    except InvalidName:
        return None


def node_id_from_auth(auth: Mapping[str, Sequence[bytes | str]]) -> str | None:
    """The node id a verified certificate names (rule in the module docstring), or None."""
    sans = _strings(auth.get("x509_subject_alternative_name"))
    uris = _strings(auth.get("peer_uri")) or sans
    tagged = [s[len(NODE_URI_PREFIX) :] for s in uris if s.startswith(NODE_URI_PREFIX)]
    if tagged:
        return _valid(tagged[0]) if len(set(tagged)) == 1 else None
    dns = _strings(auth.get("peer_dns"))
    if len(dns) == 1:
        return _valid(dns[0])
    cns = _strings(auth.get("x509_common_name"))
    if len(cns) == 1:
        return _valid(cns[0])
    return None


def peer_node_id(context: Any) -> str | None:
    """The node id of the peer on a gRPC call, from its verified client certificate; None without mTLS."""
    try:
        auth = context.auth_context()
    except Exception:  # a context without an auth context: not authenticated
        return None
    if not auth or b"ssl" not in [
        v if isinstance(v, bytes) else str(v).encode() for v in auth.get("transport_security_type", ())
    ]:
        return None  # not TLS: no verified client certificate
    if not (auth.get("x509_subject") or auth.get("x509_common_name") or auth.get("x509_subject_alternative_name")):
        return None  # TLS without a client certificate (only possible when client auth is not required)
    return node_id_from_auth(auth)


# -- a test CA -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TestCA:
    """Paths written by ``make_test_ca``."""

    __test__ = False  # not a pytest class

    ca_cert: Path
    ca_key: Path
    controller: TLSSettings
    nodes: dict[str, TLSSettings]
    admin: TLSSettings
    relays: dict[str, TLSSettings] = field(default_factory=dict)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # an existing file keeps its old mode through O_CREAT


def make_test_ca(
    out_dir: Path | str,
    nodes: Sequence[str],
    controller_hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    days: int = 365,
    relays: Sequence[str] = (),
) -> TestCA:
    """A throwaway CA with a controller server certificate, one client certificate per node
    (CN = node id, URI SAN ``starpulse-node:<id>``) and an ``admin`` client certificate.
    A relay's certificate is both: a server to its agents (the controller hosts' SANs) and
    a client to the controller named by its relay id.

    PEM files in ``out_dir``: ``ca.pem``/``ca.key``, ``controller.pem``/``.key``,
    ``<node>.pem``/``.key``, ``admin.pem``/``.key``; keys are mode 0600. For tests and demos:
    a real deployment keeps the CA key off the controller.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names = [validate_node_id(n) for n in nodes]
    reserved = sorted({ADMIN_CERT_NAME, "controller", "ca"} & set(names))
    if reserved:
        raise InvalidName(f"node id {reserved[0]!r} is reserved (its file name is taken by the test CA)")
    if len(set(names)) != len(names):
        raise ValueError("node ids repeat")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def save(stem: str, cert: x509.Certificate, k: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
        cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        pem = k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write(key_path, pem, 0o600)
        return cert_path, key_path

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "starpulse test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_cert_path, ca_key_path = save("ca", ca_cert, ca_key)

    def leaf(cn: str, sans: list[x509.GeneralName], *usage: x509.ObjectIdentifier) -> tuple[Path, Path]:
        k = key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return save(cn, builder.sign(ca_key, hashes.SHA256()), k)

    def settings(paths: tuple[Path, Path]) -> TLSSettings:
        return TLSSettings(ca_file=ca_cert_path, cert_file=paths[0], key_file=paths[1])

    host_sans: list[x509.GeneralName] = []
    for host in controller_hosts:
        try:
            host_sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            host_sans.append(x509.DNSName(host))
    controller = settings(leaf("controller", host_sans, ExtendedKeyUsageOID.SERVER_AUTH))
    node_settings = {
        n: settings(leaf(n, [x509.UniformResourceIdentifier(NODE_URI_PREFIX + n)], ExtendedKeyUsageOID.CLIENT_AUTH))
        for n in names
    }
    admin = settings(leaf(ADMIN_CERT_NAME, [], ExtendedKeyUsageOID.CLIENT_AUTH))
    relay_settings = {
        r: settings(
            leaf(
                r,
                [*host_sans, x509.UniformResourceIdentifier(NODE_URI_PREFIX + r)],
                ExtendedKeyUsageOID.SERVER_AUTH,
                ExtendedKeyUsageOID.CLIENT_AUTH,
            )
        )
        for r in [validate_node_id(r) for r in relays]
    }
    return TestCA(
        ca_cert=ca_cert_path,
        ca_key=ca_key_path,
        controller=controller,
        nodes=node_settings,
        admin=admin,
        relays=relay_settings,
    )
