"""The keeper's vocabulary: a cluster's key, its state and its record. Pure; no I/O, no clock.

A cluster belongs to the (user, wallet) pair that asked for it; at most one live cluster exists per pair
(creation is exclusive per pair across replicas, see `service`). Its `cluster_id` is minted when its
primary is launched, so a pair whose cluster ended gets a new, distinct one. Ids are 1 to 64 characters of letters, digits, `-` and `_`, starting with a letter
or digit (they become EC2 tag values, redis keys and swarm names); `none` is a valid wallet id and means
"no wallet".
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass

from swarm_autoscaler.config.profiles import DEFAULT_PROFILE

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ID_RULE = "1 to 64 characters of letters, digits, '-' and '_', starting with a letter or digit"
NO_WALLET = "none"


class InvalidIdError(ValueError):
    """An id that breaks `ID_RULE`; the message names the id's role and the rule."""


class UnknownProfileError(InvalidIdError):
    """A profile the keeper does not know (`AUTOSCALER_KEEPER_PROFILES`); the message names the known."""


def known_profile(name: str, known: Collection[str]) -> str:
    """`name` if it is one of the `known` profiles, else `UnknownProfileError`."""
    if name not in known:
        raise UnknownProfileError(
            f"unknown profile {name[:80]!r}; this keeper's profiles: {', '.join(sorted(known))}"
        )
    return name


class ClusterState(enum.StrEnum):
    """`starting` until its scheduler answers, then `running`; `ending` once the keeper decided to end
    it (its machines are being terminated); `failed` when its primary did not come up in time."""

    STARTING = "starting"
    RUNNING = "running"
    ENDING = "ending"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ClusterKey:
    """Who a cluster belongs to. Construct with `ClusterKey.parse` to validate."""

    user_id: str
    wallet_id: str

    @staticmethod
    def parse(user_id: str, wallet_id: str) -> ClusterKey:
        for role, value in (("user_id", user_id), ("wallet_id", wallet_id)):
            if not ID_PATTERN.fullmatch(value):
                raise InvalidIdError(f"{role} {value[:80]!r} is not valid: {ID_RULE}")
        return ClusterKey(user_id, wallet_id)

    @property
    def lock_name(self) -> str:
        """The name of the lock that makes get-or-create exclusive for this pair."""
        return f"create:{self.user_id}:{self.wallet_id}"


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the keeper knows of one cluster, rebuilt from its primary's EC2 tags and a probe of its
        scheduler. Times are epoch seconds. `last_heartbeat` is the last sign of use: a client's request or
    heartbeat, or work seen in its scheduler. `last_answered` is when its scheduler last answered (None:
    never). `reason` says why a cluster failed or is ending. `profile` names its images and machines."""

    cluster_id: str
    key: ClusterKey
    state: ClusterState
    created_at: float
    last_heartbeat: float
    last_answered: float | None = None
    primary_id: str = ""
    scheduler_url: str = ""
    dashboard_url: str = ""
    reason: str = ""
    profile: str = DEFAULT_PROFILE  # what it is made of (`config.profiles`), fixed at creation
    private_ip: str = ""  # its primary's: the only address its one-time credentials token works from

    @property
    def live(self) -> bool:
        """Starting or running: a request for its key gets this cluster."""
        return self.state in (ClusterState.STARTING, ClusterState.RUNNING)
