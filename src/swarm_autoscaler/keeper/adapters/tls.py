"""Each cluster's own certificate authority and certificates, for dask TLS (`tls://`).

One CA per cluster signs three certificates: the scheduler's, the workers' (and the cluster's own
autoscaler's) and the client's. dask's TLS is mutual: the scheduler accepts a connection only from a
peer whose certificate this cluster's CA signed, so a client without the cluster's credentials is refused
at the handshake, before any pickled function is read. dask does not check hostnames, so no certificate
names an address. Keys are ECDSA P-256 (fast to make, small in redis); certificates last `VALID_DAYS`.

The PEM texts are secrets: never logged, never put in EC2 tags. The keeper keeps them in its credential
store (`keeper.credentials`) and hands them out only through its token-protected routes.
"""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from swarm_autoscaler.keeper.credentials import Credentials

VALID_DAYS = 400


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """`key` as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def cert_pem(cert: x509.Certificate) -> str:
    """`cert` as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def name(common: str) -> x509.Name:
    """An X.509 name of just a common name."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def cert_builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int = VALID_DAYS
) -> x509.CertificateBuilder:
    """A certificate for `key`, valid from 5 minutes ago for `days` (the keeper's clusters' and its API's)."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a primary's clock may lag a little
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf(
    cluster_id: str, role: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        cert_builder(name(f"{cluster_id} {role}"), ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert_pem(cert), key_pem(key)


def make_credentials(cluster_id: str) -> Credentials:
    """A new CA for `cluster_id` and its scheduler, worker and client certificates."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    subject = name(f"swarm-autoscaler cluster {cluster_id} CA")
    ca = (
        cert_builder(subject, subject, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    scheduler = _leaf(cluster_id, "scheduler", ca, ca_key)
    worker = _leaf(cluster_id, "worker", ca, ca_key)
    client = _leaf(cluster_id, "client", ca, ca_key)
    return Credentials(cert_pem(ca), key_pem(ca_key), *scheduler, *worker, *client)
