"""Secrets sealed at rest: what the keeper writes to redis that must stay secret (each cluster's CA,
scheduler, worker and client private keys) is encrypted with a key redis never sees.

AES-256-GCM (`cryptography`), a fresh 96-bit nonce per value, and the redis key name as associated data:
a sealed value copied under another cluster's key does not open. A sealed value is `sa1:` and the
base64 of nonce and ciphertext. The key is 32 random bytes, base64 (`swarm-autoscaler keeper` reads it
from `AUTOSCALER_KEEPER_SECRETS_KEY`, or from the file `AUTOSCALER_KEEPER_SECRETS_KEY_FILE`, a swarm secret
mounted at `/run/secrets/...`; docs/security.md). Make one with
`python3 -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())'`.

User tokens need no sealing: redis keeps only their SHA-256 (`keeper.access`), and the primaries' one-time
tokens are never stored (an HMAC of the cluster id under the admin token).
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from swarm_autoscaler.errors import ConfigurationError

PREFIX = "sa1:"


class SealError(Exception):
    """A sealed value that does not open with this key (another key, or tampered with)."""


def key_from_text(text: str, setting: str = "AUTOSCALER_KEEPER_SECRETS_KEY") -> bytes:
    """The 32-byte key from its base64 text; `ConfigurationError` naming `setting` otherwise."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ConfigurationError(
            f"{setting}: expected 32 random bytes in base64 (44 characters), e.g. from "
            "python3 -c 'import os,base64;print(base64.b64encode(os.urandom(32)).decode())'"
        )
    return key


class Sealer:
    """Seals and opens values bound to a name (the redis key they are stored under)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, name: str, plaintext: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), name.encode())
        return PREFIX + base64.b64encode(nonce + sealed).decode()

    def open(self, name: str, stored: str) -> str:
        """The plaintext of a sealed value; `SealError` when it does not open here."""
        if not stored.startswith(PREFIX):
            raise SealError("not a sealed value")
        try:
            raw = base64.b64decode(stored[len(PREFIX) :], validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], name.encode()).decode()
        except (binascii.Error, ValueError, InvalidTag) as exc:
            raise SealError(f"does not open with this key ({type(exc).__name__})") from None


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX)
