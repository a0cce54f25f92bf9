"""A self-signed CA and a serving certificate for the injection webhook.

The operator owns its webhook's trust: the CA goes into the webhook configuration's caBundle
(stepscope.operator.injection.webhook keeps it there and shares the certificate between replicas through a
Secret), so no cert-manager is needed. On disk the private key exists only while the TLS context
loads it."""
from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)  # the private key: never in a log or traceback

    def secret_data(self) -> dict[str, str]:
        """As a kubernetes.io/tls Secret's data (base64), with the CA beside it."""
        return {"tls.crt": _b64(self.cert_pem), "tls.key": _b64(self.key_pem), "ca.crt": _b64(self.ca_pem)}

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> ServingCert:
        return cls(*(base64.b64decode(data[k]) for k in ("ca.crt", "tls.crt", "tls.key")))

    def server_context(self) -> ssl.SSLContext:
        """A TLS server context with this certificate (ssl loads keys from files only: a private
        temporary directory, removed before this returns)."""
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="stepscope-webhook-") as folder:
            cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert_file.write_bytes(self.cert_pem)
            key_file.write_bytes(self.key_pem)  # the directory is 0700
            context.load_cert_chain(cert_file, key_file)
        return context


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


# Long-lived like other self-signed webhook certificates: rotate by deleting its Secret and
# restarting the operator (docs/security.md).
DAYS = 3650


def generate(names: list[str], days: int = DAYS) -> ServingCert:
    """A certificate for `names` (DNS names or IPs) signed by a fresh CA."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stepscope-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return ServingCert(ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM),
                       key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
