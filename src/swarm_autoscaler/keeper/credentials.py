"""Each cluster's TLS credentials, and who may have them.

A cluster's credentials (a CA of its own and the scheduler's, workers' and client's certificates, see
`adapters.tls`) are made on first use and kept in a `CredentialStore` shared by every replica (redis, or
this process alone without redis), so every replica hands out the same ones. They are never written to
EC2 tags or logs.

Two holders may read them:

- the cluster's primary, once: its boot script carries a one-time token, `primary_token(secret,
  cluster id)` (an HMAC of the cluster id under the keeper's API token, so any replica can check it
  without storing it), and `GET /v1/primaries/{cluster_id}/credentials` with it answers once; a second
  use gets 410 Gone. User data is readable by whoever may call DescribeInstanceAttribute, so a token
  already used is worth nothing to them; with `AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS` it works only
  from the primary's private IP (`by_primary`), so one read before the primary boots is worth nothing
  either;
- the cluster's user, through the keeper's token-protected API (`GET /v1/clusters/{user}/{wallet}/
  credentials`): the client's certificate and the CA's.

A set is made only while a cluster is `starting` (its primary fetches it at boot, before its scheduler
answers). Once the cluster runs, its primary holds its CA: if the store then has nothing (redis flushed,
replaced or restored from an old dump), the keeper makes no new CA for it (its users' files would not
match the scheduler's), answers 409 and logs an error saying what to do (`LOST`): the operator ends that
cluster and the user creates a new one. The spent-token mark is lost with the store, but a running
cluster's primary route is refused the same way, so the one-time token never works a second time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from swarm_autoscaler.keeper.model import Cluster

LOST = (
    "this running cluster's TLS credentials are gone from the keeper's store (redis flushed or replaced?); "
    "its primary still uses its old CA, so no new one is made: end the cluster (DELETE "
    "/v1/clusters/<user>/<wallet>) and create it again"
)


def primary_token(secret: str, cluster_id: str) -> str:
    """The one-time token of `cluster_id`'s primary (hex), derived from the keeper's API token."""
    return hmac.new(secret.encode(), f"primary-credentials:{cluster_id}".encode(), hashlib.sha256).hexdigest()


def listing_token(secret: str, cluster_id: str) -> str:
    """The token with which `cluster_id`'s own autoscaler reads its instance listing from the keeper
    (hex; reusable, read-only, that cluster's listing only), derived from the keeper's API token."""
    return hmac.new(secret.encode(), f"primary-listing:{cluster_id}".encode(), hashlib.sha256).hexdigest()


def deployment_id(secret: str) -> str:
    """This keeper deployment's identity (16 hex digits), derived from its API token: every replica has it,
    a restart or a lost redis keeps it, and two keepers given one name by hand (each its own token) differ.
    The HMAC does not reveal the token (the primaries' tokens in user data are HMACs under it too)."""
    return hmac.new(secret.encode(), b"keeper-deployment", hashlib.sha256).hexdigest()[:16]


def listing_token_matches(secret: str, cluster_id: str, given: str) -> bool:
    """Constant-time check of a listing token."""
    return hmac.compare_digest(listing_token(secret, cluster_id).encode(), given.encode())


def token_matches(secret: str, cluster_id: str, given: str) -> bool:
    """Constant-time check of a primary's token."""
    return hmac.compare_digest(primary_token(secret, cluster_id).encode(), given.encode())


def by_primary(cluster: Cluster | None, transport: Any) -> bool:
    """Whether a request on `transport` (an asyncio transport: its peer is the TCP source) comes from
    `cluster`'s primary, at the private IP the keeper lists for it (`AUTOSCALER_KEEPER_BIND_PRIMARY_TOKENS`):
    the one-time token works from there alone, so a token read from user data before the primary boots (a
    read-only principal) is worth nothing elsewhere, and a refused use does not spend it. A cluster this
    replica does not list yet, an unknown address or a peer that is no IP matches nothing (the boot's curl
    retries); an IPv4-mapped peer (a dual-stack socket) counts as its IPv4 address."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    if cluster is None or not cluster.private_ip or not peer:
        return False
    try:
        ip = ipaddress.ip_address(str(peer[0]))
    except ValueError:
        return False
    plain = str(getattr(ip, "ipv4_mapped", None) or ip)
    return hmac.compare_digest(plain.encode(), cluster.private_ip.encode())


@dataclass(frozen=True, slots=True)
class Credentials:
    """The PEM files of one cluster. `ca_key` never leaves the keeper."""

    ca_cert: str
    ca_key: str
    scheduler_cert: str
    scheduler_key: str
    worker_cert: str
    worker_key: str
    client_cert: str
    client_key: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Credentials:
        return Credentials(**json.loads(text))

    def for_primary(self) -> dict[str, str]:
        """What the primary needs: the CA's certificate, the scheduler's and the workers' pairs."""
        return {
            "ca.pem": self.ca_cert,
            "scheduler.pem": self.scheduler_cert,
            "scheduler-key.pem": self.scheduler_key,
            "worker.pem": self.worker_cert,
            "worker-key.pem": self.worker_key,
        }

    def for_client(self) -> dict[str, str]:
        """What a user's client needs: the CA's certificate and the client's pair."""
        return {"ca.pem": self.ca_cert, "client.pem": self.client_cert, "client-key.pem": self.client_key}


MakeCredentials = Callable[[str], Credentials]


@runtime_checkable
class CredentialStore(Protocol):
    """Credentials by cluster id, shared by every replica."""

    async def get_or_make(self, cluster_id: str) -> Credentials:
        """The cluster's credentials; made and stored on first use (concurrent first uses through any
        replicas agree on one set: the first stored wins)."""
        ...

    async def get(self, cluster_id: str) -> Credentials | None:
        """The cluster's credentials if stored, else None: never makes a set (a running cluster's
        primary already holds its CA; a new one would not be the one it trusts)."""
        ...

    async def use_once(self, cluster_id: str) -> bool:
        """True the first time it is called for `cluster_id` (the primary's token is then spent), False
        after."""
        ...

    async def forget(self, cluster_id: str) -> None:
        """Drop a gone cluster's credentials (idempotent)."""
        ...


class InProcessCredentials:
    """`CredentialStore` for a single replica (no `AUTOSCALER_REDIS_URL`): a restart forgets them, so a
    primary launched before a restart keeps its own and its users must get a new cluster."""

    def __init__(self, make: MakeCredentials) -> None:
        self._make = make
        self._made: dict[str, Credentials] = {}
        self._used: set[str] = set()

    async def get_or_make(self, cluster_id: str) -> Credentials:
        if cluster_id not in self._made:
            made = await asyncio.to_thread(self._make, cluster_id)
            self._made.setdefault(cluster_id, made)
        return self._made[cluster_id]

    async def get(self, cluster_id: str) -> Credentials | None:
        return self._made.get(cluster_id)

    async def use_once(self, cluster_id: str) -> bool:
        if cluster_id in self._used:
            return False
        self._used.add(cluster_id)
        return True

    async def forget(self, cluster_id: str) -> None:
        self._made.pop(cluster_id, None)
