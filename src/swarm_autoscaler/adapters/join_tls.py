"""TLS for the join endpoint: a key every replica derives from the swarm's worker join token, pinned
in the user data of the machines that fetch the token.

The join endpoint (`daemon.join`) hands a booting machine the worker join token; over plain HTTP anyone
on the VPC path could read it. So the endpoint serves TLS only, with a P-256 key that is a function of
the worker join token (`join_key`: HMAC-SHA256 under the token, reduced to a scalar), and a self-signed
certificate for it. Every replica reads the same token from swarm, so every replica serves the same
key with nothing to store or share, and the launching replica knows the key's public half when it
renders user data: the user data carries `join_pin(token)` (SHA-256 of the public key, not a secret),
and the boot's curl fetch (`boot_scripts.ticket_join`) uses `-k --pinnedpubkey sha256//<pin>`: curl
checks the server's public key against the pin before it sends the request, so a listener with any
other key (an impostor on the VPC path) gets nothing, not even the ticket (curl exits 90).

Rotating the worker join token rotates the key; the tickets of machines still booting are HMACs under
the old token anyway (`adapters.join_tickets`), so both move together. `JoinTls.use` reloads the served
key in place (cheap: nothing happens while the token is unchanged).

Why the token as the secret: only managers can read it (the daemon reads it from swarm), and whoever
holds it can join the swarm anyway, so the key protects nothing the token does not already give.
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import hmac
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_INFO = b"swarm-autoscaler join tls"
# The order of P-256's base point (n): the scalar is reduced into [1, n - 1].
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_SUBJECT = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swarm-autoscaler join endpoint")])
# curl checks the pin, not dates (-k): the validity only has to be wide.
_NOT_BEFORE = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(2120, 1, 1, tzinfo=datetime.UTC)


def join_key(join_token: str) -> ec.EllipticCurvePrivateKey:
    """The join endpoint's private key for `join_token`: the same on every replica."""
    digest = hmac.new(join_token.encode(), _INFO, hashlib.sha256).digest()
    scalar = int.from_bytes(digest, "big") % (_P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


@functools.lru_cache(maxsize=4)
def join_pin(join_token: str) -> str:
    """The pin machines check (curl's `--pinnedpubkey sha256//<pin>`): base64 SHA-256 of the DER
    SubjectPublicKeyInfo of `join_key(join_token)`."""
    spki = (
        join_key(join_token)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def pin_of_certificate(der: bytes) -> str:
    """The pin of a certificate's public key (DER certificate, as `SSLSocket.getpeercert(True)`)."""
    spki = (
        x509.load_der_x509_certificate(der)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def _pem_pair(join_token: str) -> tuple[bytes, bytes]:
    """(self-signed certificate, private key), PEM, for `join_key(join_token)`."""
    key = join_key(join_token)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_SUBJECT)
        .issuer_name(_SUBJECT)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(_NOT_BEFORE)
        .not_valid_after(_NOT_AFTER)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class JoinTls:
    """The join listener's TLS context. Until `use` is first called it holds no key (every handshake
    fails: the endpoint is not ready then anyway); `use(token)` loads the key for `token` into the same
    context, which the listener keeps, so connections made after it get the new key."""

    def __init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._token: str | None = None

    @property
    def pin(self) -> str | None:
        """The pin of the key served now (None before the first `use`)."""
        return None if self._token is None else join_pin(self._token)

    def use(self, join_token: str) -> bool:
        """Serve the key of `join_token` from now on; True when that changed the key."""
        if join_token == self._token:
            return False
        cert_pem, key_pem = _pem_pair(join_token)
        # The ssl module loads keys from files only: a private directory, gone once loaded.
        with tempfile.TemporaryDirectory(prefix="join-tls-") as tmp:
            cert_file, key_file = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            for path, data in ((cert_file, cert_pem), (key_file, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as file:
                    file.write(data)
            self.context.load_cert_chain(cert_file, key_file)
        self._token = join_token
        return True
