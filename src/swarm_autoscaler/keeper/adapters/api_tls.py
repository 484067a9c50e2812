"""The keeper's own HTTPS certificate, when the operator gives none (`AUTOSCALER_KEEPER_TLS_CERT_FILE`).

The keeper's API carries secrets both ways (the admin and user tokens, every cluster's TLS files), so
it serves HTTPS by default. Without a certificate from the operator the keeper makes its own: a CA
(ECDSA P-256, `CA_DAYS`) and a server certificate it signs whose subject alternative names are the host
of `AUTOSCALER_KEEPER_PUBLIC_URL` (what the primaries fetch from), `localhost` and `127.0.0.1`
(`api_hosts`). The CA's certificate is public: it goes into each primary's user data (`{{keeper_ca}}`),
where the boot script's `curl --cacert` and the cluster's autoscaler's listing reads verify the keeper
with it, so a machine on the VPC that answers in the keeper's place gets no token.

Kept like the clusters' keys (`redis_credentials`): one redis key per keeper,
`swarm-autoscaler:keeper:<name>:api-tls` (JSON of the PEM texts and the hosts), written with SET NX, so
every replica serves the same certificate and a restart keeps it (the running primaries keep trusting
it), sealed with the secrets key when one is set. A stored certificate that does not cover the hosts
wanted now (the public URL changed) or ends within `RENEW_DAYS` is replaced by one the same CA signs,
so the primaries' trust survives it. Without redis the single replica makes a new set at each start.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from swarm_autoscaler.adapters.redis_lock import _password_of, open_client, redact_url, redis_call
from swarm_autoscaler.keeper.adapters.redis_credentials import CredentialsUnreadableError
from swarm_autoscaler.keeper.adapters.redis_leases import KEY_PREFIX
from swarm_autoscaler.keeper.adapters.sealing import Sealer, SealError, is_sealed
from swarm_autoscaler.keeper.adapters.tls import cert_builder, cert_pem, key_pem, name

CA_DAYS = 3650
LEAF_DAYS = 825
RENEW_DAYS = 30
LOCAL_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True, slots=True)
class ApiPki:
    """The keeper's CA and the server certificate it signed (PEM texts), and the hosts it names."""

    ca_pem: str
    ca_key_pem: str
    cert_pem: str
    key_pem: str
    hosts: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ApiPki:
        raw = json.loads(text)
        return cls(raw["ca_pem"], raw["ca_key_pem"], raw["cert_pem"], raw["key_pem"], tuple(raw["hosts"]))

    def serves(self, hosts: Sequence[str], now: datetime.datetime | None = None) -> bool:
        """True when the server certificate names every one of `hosts` and is not about to end."""
        ends = x509.load_pem_x509_certificate(self.cert_pem.encode()).not_valid_after_utc
        moment = now or datetime.datetime.now(datetime.UTC)
        return set(hosts) <= set(self.hosts) and ends - moment > datetime.timedelta(days=RENEW_DAYS)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the CA certificate (DER), as `openssl x509 -fingerprint -sha256` prints it."""
        der = x509.load_pem_x509_certificate(self.ca_pem.encode()).public_bytes(serialization.Encoding.DER)
        digest = hashlib.sha256(der).hexdigest().upper()
        return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def api_hosts(public_url: str | None) -> tuple[str, ...]:
    """The names the server certificate must carry: the public URL's host, then the local ones."""
    host = urlsplit(public_url).hostname if public_url else None
    return tuple(dict.fromkeys([*([host] if host else []), *LOCAL_HOSTS]))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue(ca_pem: str, ca_key_pem: str, hosts: Sequence[str]) -> ApiPki:
    """A new server certificate for `hosts`, signed by this CA."""
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        cert_builder(name(f"swarm-autoscaler keeper {hosts[0]}"), ca.subject, key, LEAF_DAYS)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # key identifiers: clients with strict X.509 checks (Python 3.13's default) require them
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ApiPki(ca_pem, ca_key_pem, cert_pem(cert), key_pem(key), tuple(hosts))


def make_api_pki(keeper_name: str, hosts: Sequence[str]) -> ApiPki:
    """A new CA for this keeper's API and a server certificate for `hosts`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    common = f"swarm-autoscaler keeper {keeper_name} API CA"
    subject = name(common)
    ca = (
        cert_builder(subject, subject, ca_key, CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return issue(cert_pem(ca), key_pem(ca_key), hosts)


def server_context_of(pki: ApiPki) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) serving the certificate and its CA as the chain. The
    PEM texts pass through a private temporary folder (`load_cert_chain` reads files only)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="keeper-api-tls-") as folder:  # mode 0700
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        with open(cert, "w", encoding="ascii") as out:
            out.write(pki.cert_pem + pki.ca_pem)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="ascii") as out:
            out.write(pki.key_pem)
        context.load_cert_chain(cert, key)
    return context


class RedisApiPki:
    """The keeper's API certificate in one redis, shared by its replicas (see the module docstring)."""

    def __init__(
        self, url: str, keeper_name: str, *, sealer: Sealer | None = None, timeout: float = 5.0
    ) -> None:
        self._key = f"{KEY_PREFIX}{keeper_name}:api-tls"
        self._name = keeper_name
        self._sealer = sealer
        self._endpoint = f"redis {redact_url(url)}"
        self._password = _password_of(url)
        self._redis = open_client(url, timeout)

    async def get_or_make(self, hosts: Sequence[str]) -> ApiPki:
        """The stored set, made first when none is, and re-issued by the same CA when it does not serve
        `hosts` any more."""
        stored = await self._call(self._redis.get(self._key))
        if stored is None:
            made = make_api_pki(self._name, hosts)
            await self._call(self._redis.set(self._key, self._seal(made.to_json()), nx=True))
            stored = await self._call(self._redis.get(self._key))  # another replica's, if it was first
        pki = self._opened(stored)
        if not pki.serves(hosts):
            pki = issue(pki.ca_pem, pki.ca_key_pem, tuple(dict.fromkeys([*hosts, *pki.hosts])))
            await self._call(self._redis.set(self._key, self._seal(pki.to_json())))
        elif self._sealer is not None and not is_sealed(_text(stored)):  # left by a keeper without the key
            await self._call(self._redis.set(self._key, self._seal(pki.to_json())))
        return pki

    def _seal(self, text: str) -> str:
        return text if self._sealer is None else self._sealer.seal(self._key, text)

    def _opened(self, stored: bytes | str) -> ApiPki:
        text = _text(stored)
        if not is_sealed(text):
            return ApiPki.from_json(text)
        if self._sealer is None:
            raise CredentialsUnreadableError(
                "the keeper's API certificate in redis is sealed: set AUTOSCALER_KEEPER_SECRETS_KEY (or _FILE) "
                "to the key that sealed it"
            )
        try:
            return ApiPki.from_json(self._sealer.open(self._key, text))
        except SealError as exc:
            raise CredentialsUnreadableError(
                f"the keeper's API certificate in redis {exc}: AUTOSCALER_KEEPER_SECRETS_KEY must be the key "
                "every replica of this keeper uses"
            ) from None

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await redis_call(awaitable, self._endpoint, self._password)


def _text(stored: bytes | str) -> str:
    return stored.decode() if isinstance(stored, bytes) else stored
