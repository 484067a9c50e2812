"""Loopback networks (`127.N.0.0/16`) for local clouds, each held by one owner at a time on this machine.

A local cloud whose VPC is carved from loopback gives its machines addresses its servers listen on
(schedulers, metrics, the join endpoint's source check). Two clouds on one prefix share those addresses:
a keeper then reads the other cloud's scheduler at its primary's address and takes its cluster for
running before its own primary booted (seen in the fast lane, whose two pytest-xdist workers run local
clouds side by side with the dockerd lane's). So a prefix is claimed with an exclusive `flock` on a file
named after it, which other processes (and other claims in this one: a lock belongs to its open file)
see, and which the kernel releases when the holder exits, whatever the way. `127.0` is never handed
out: the local swarm's managers and dockerd nodes live there.
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
from pathlib import Path

_DIR = Path(tempfile.gettempdir()) / "swarm-autoscaler-loopback"
_HELD: dict[str, int] = {}


def claim_loopback_prefix() -> str:
    """A `127.N` prefix (N in 1..254, drawn at random) that no other local cloud on this machine holds,
    held until `release_loopback_prefix` or this process's exit."""
    _DIR.mkdir(mode=0o700, exist_ok=True)
    for n in random.SystemRandom().sample(range(1, 255), 254):
        prefix = f"127.{n}"
        fd = os.open(_DIR / f"{prefix}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _HELD[prefix] = fd
        return prefix
    raise RuntimeError(f"every loopback network 127.1-254 is held by a local cloud ({_DIR})")


def release_loopback_prefix(prefix: str) -> None:
    """Let another local cloud use `prefix` (a prefix this process does not hold: nothing)."""
    fd = _HELD.pop(prefix, None)
    if fd is not None:
        os.close(fd)
