"""Certificates for the mesh's mutual TLS, for local clusters, tests and trying it out
(``cascade mesh-certs``). Production issues them with cert-manager (k8s/components/mesh-tls).

One CA signs one certificate that every member uses as server and as client; its DNS name is the
mesh's server name (``cascade.serving.mesh.security``)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cascade.serving.mesh.security import CA, CERT, DEFAULT_SERVER_NAME, KEY


@dataclass(frozen=True)
class Authority:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=days))


def new_authority(common_name: str = "cascade-mesh-ca", days: int = 365) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _validity(x509.CertificateBuilder(), days).subject_name(_name(common_name))
    builder = builder.issuer_name(_name(common_name)).public_key(key.public_key())
    builder = builder.serial_number(x509.random_serial_number()).add_extension(
        x509.BasicConstraints(ca=True, path_length=0), critical=True)
    return Authority(key, builder.sign(key, hashes.SHA256()))


def issue(authority: Authority, server_name: str = DEFAULT_SERVER_NAME, days: int = 365
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A member certificate for ``server_name``, good for serving and for dialling."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _validity(x509.CertificateBuilder(), days).subject_name(_name(server_name))
    builder = builder.issuer_name(authority.certificate.subject).public_key(key.public_key())
    builder = builder.serial_number(x509.random_serial_number())
    builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name)]),
                                    critical=False)
    builder = builder.add_extension(x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return key, builder.sign(authority.key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_member(authority: Authority, folder: Path, server_name: str = DEFAULT_SERVER_NAME,
                 days: int = 365) -> Path:
    """``folder`` with tls.crt, tls.key (mode 600) and ca.crt, as ``--tls-dir`` reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    key, certificate = issue(authority, server_name, days)
    (folder / CERT).write_bytes(_pem(certificate))
    (folder / KEY).touch(mode=0o600)
    (folder / KEY).write_bytes(_key_pem(key))
    (folder / CA).write_bytes(_pem(authority.certificate))
    return folder


def make_mesh_certs(folder: Path, server_name: str = DEFAULT_SERVER_NAME, days: int = 365) -> Path:
    """A fresh CA and one member certificate in ``folder`` (the CA's key is not kept)."""
    return write_member(new_authority(days=days), folder, server_name, days)
