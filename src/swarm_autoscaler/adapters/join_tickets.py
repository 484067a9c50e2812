"""Join tickets: what a machine's user data carries instead of the swarm's worker join token.

User data is readable by anyone allowed `ec2:DescribeInstanceAttribute` and, through the metadata service,
by every process on the machine; tags by anyone with `ReadOnlyAccess`. So with `AUTOSCALER_EC2_JOIN_URL`
set, a launch (or a warm-pool start) writes a random nonce on its instances as the tag `JOIN_NONCE_TAG`,
and their user data carries the ticket `ticket(worker join token, nonce)` and the daemon's join URL. At
boot the machine posts the ticket from its own private address (`boot_scripts.ticket_join`); the daemon
(`daemon.join`) answers the token and a manager's address only to the private IP of an instance of its
own whose nonce gives that ticket, that has no swarm node yet and that started less than
`AUTOSCALER_MAX_START_TIME` ago. The ticket is worthless elsewhere: another address, a joined machine or
an old one gets nothing (docs/security.md).

Why an HMAC under the join token: only managers read the token, so a tag alone (a principal that can
list tags but not read user data) does not give the ticket, and every replica computes it from what it
already holds (swarm's token, EC2's tag): nothing to store or share. Rotating the worker join token
makes the tickets of machines still booting worthless: they fail their boot and are replaced.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

JOIN_NONCE_TAG = "swarm-autoscaler/join-nonce"
JOIN_PATH = "/v1/join"  # the daemon's join endpoint (`daemon.join`), TLS on AUTOSCALER_EC2_JOIN_PORT
TICKET = re.compile(r"[0-9a-f]{64}")  # what `ticket` returns: hex SHA-256
_NONCE = re.compile(r"[0-9a-f]{32}")


def new_nonce() -> str:
    """A fresh random nonce (128 bits, hex), one per RunInstances or warm-pool start."""
    return secrets.token_hex(16)


def ticket(join_token: str, nonce: str) -> str:
    """The ticket for `nonce`: HMAC-SHA256 under the swarm's worker join token (hex)."""
    return hmac.new(
        join_token.encode(), f"swarm-autoscaler-join:{nonce}".encode(), hashlib.sha256
    ).hexdigest()


def ticket_matches(join_token: str, nonce: str, given: str) -> bool:
    """Constant-time check of a presented ticket against `nonce` (a nonce of the wrong shape, as a tag
    someone else wrote could be, matches nothing)."""
    if not _NONCE.fullmatch(nonce) or not TICKET.fullmatch(given):
        return False
    return hmac.compare_digest(ticket(join_token, nonce).encode(), given.encode())
