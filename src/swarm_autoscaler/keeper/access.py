"""Who may call the keeper's API: the admin token and per-user tokens.

Two kinds of bearer token:

- the **admin** token, `AUTOSCALER_KEEPER_TOKEN`: every route, every user's clusters, and the admin
  routes (issuing and revoking user tokens, setting budgets);
- a **user** token, issued by the admin for one user id (`POST /v1/users/{user_id}/token`), shown once:
  only that user's clusters (create, read, heartbeat, credentials, delete), only that user's usage, and
  the listing filtered to that user's clusters. Another user's path answers 403.

User tokens are kept **hashed**: the store holds the SHA-256 of each token (`token_digest`), never the
token itself, so a dump of redis lets no one call the API. A token is 256 random bits, so a plain hash
(no salt, no slow hash) is as strong as the token. Issuing again replaces the user's token (the old one
stops working at once); revoking removes it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

TOKEN_PREFIX = "kut_"  # keeper user token: recognisable in a leaked-secrets scan


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: the admin (`user_id` None) or one user."""

    user_id: str | None

    @property
    def admin(self) -> bool:
        return self.user_id is None

    def may_act_for(self, user_id: str) -> bool:
        """The admin may act for anyone; a user for itself only."""
        return self.user_id is None or self.user_id == user_id


ADMIN = Principal(None)


def new_token() -> str:
    """A fresh user token (256 random bits, URL-safe)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What the store keeps of a token (hex SHA-256)."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_admin(admin_token: str, given: str) -> bool:
    """Constant-time comparison with the admin token."""
    return hmac.compare_digest(admin_token.encode(), given.encode())


@runtime_checkable
class TokenStore(Protocol):
    """User tokens by digest, shared by every replica."""

    async def issue(self, user_id: str) -> str:
        """A new token for `user_id`, replacing any previous one (which stops working). Returns the
        token itself: the only time anyone sees it."""
        ...

    async def revoke(self, user_id: str) -> bool:
        """Remove `user_id`'s token; False when it had none."""
        ...

    async def user_of(self, token: str) -> str | None:
        """The user whose token this is, else None."""
        ...


class InProcessTokens:
    """`TokenStore` for a single replica without redis: a restart forgets every user token (the admin
    issues them again)."""

    def __init__(self) -> None:
        self._users: dict[str, str] = {}  # digest -> user
        self._digests: dict[str, str] = {}  # user -> digest

    async def issue(self, user_id: str) -> str:
        token = new_token()
        await self.revoke(user_id)
        digest = token_digest(token)
        self._users[digest] = user_id
        self._digests[user_id] = digest
        return token

    async def revoke(self, user_id: str) -> bool:
        digest = self._digests.pop(user_id, None)
        if digest is None:
            return False
        self._users.pop(digest, None)
        return True

    async def user_of(self, token: str) -> str | None:
        return self._users.get(token_digest(token))
