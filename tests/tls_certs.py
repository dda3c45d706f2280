"""Certificates made by the tests: a CA, a server certificate for 127.0.0.1 and localhost and a
client certificate it signs, another CA's client certificate, and a key of no certificate."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    """A client certificate of another CA."""
    stranger_key: Path
    other_key: Path
    """A private key that belongs to none of the certificates."""


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(subject: str, key, issuer=None, issuer_key=None, ca: bool = False, server: bool = False):
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())


def make_certs(out: Path) -> Certs:
    from cryptography.hazmat.primitives import serialization

    out.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM

    def write(name: str, data: bytes) -> Path:
        (out / name).write_bytes(data)
        return out / name

    ca_key, other_ca_key = _key(), _key()
    ca = _cert("lmiserve test CA", ca_key, ca=True)
    other_ca = _cert("another CA", other_ca_key, ca=True)
    server_key, client_key, stranger_key = _key(), _key(), _key()
    server = _cert("127.0.0.1", server_key, ca, ca_key, server=True)
    client = _cert("a client", client_key, ca, ca_key)
    stranger = _cert("a stranger", stranger_key, other_ca, other_ca_key)
    return Certs(
        ca=write("ca.pem", ca.public_bytes(pem)),
        server_cert=write("server.pem", server.public_bytes(pem)),
        server_key=write("server.key", _pem_key(server_key)),
        client_cert=write("client.pem", client.public_bytes(pem)),
        client_key=write("client.key", _pem_key(client_key)),
        stranger_cert=write("stranger.pem", stranger.public_bytes(pem)),
        stranger_key=write("stranger.key", _pem_key(stranger_key)),
        other_key=write("other.key", _pem_key(_key())),
    )
