"""The EC2 side of joining, for `Ec2Cloud`: the join in each launch's (or warm-pool start's) user data,
and the fresh read the join endpoint makes of the machine asking for the swarm join token.

Without join URLs (`AUTOSCALER_EC2_JOIN_URL` unset) the user data carries `docker swarm join --token`
as it always did. With them it carries a join ticket instead (`adapters.join_tickets`), and the
launch's instances get the ticket's nonce as the tag `JOIN_NONCE_TAG`: one nonce per RunInstances (all
its instances share one user data) or per warm-pool start. What binds a ticket to one machine is the
endpoint's check of the source address (`daemon.join`), not the nonce.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from swarm_autoscaler.adapters.boot_scripts import (
    render_start_user_data,
    render_ticket_start_user_data,
    render_ticket_user_data,
    render_user_data,
)
from swarm_autoscaler.adapters.ec2_support import to_endpoint_error, to_instance
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG, new_nonce, ticket
from swarm_autoscaler.core.model import Instance


class JoinHost(Protocol):
    """What these calls need of `Ec2Cloud`."""

    endpoint: str
    join_urls: tuple[str, ...]
    _join_command: Callable[[], Awaitable[tuple[str, str]]]
    _join_paused: bool

    async def _pages(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]: ...

    def _ownership_filters(self) -> list[dict[str, Any]]: ...

    def _owned(self, raw: Mapping[str, Any]) -> bool: ...


async def join_user_data(host: JoinHost, boot_script: str | None) -> tuple[str, dict[str, str]]:
    """(user data, tags to add to the instances) for a launch running `boot_script`, or for a warm-pool
    start (`boot_script` None: the boot script ran on its first boot). Raises what `join_command`
    raises (`AutoscalerError`)."""
    token, manager = await host._join_command()
    paused = host._join_paused
    if not host.join_urls:
        if boot_script is None:
            return render_start_user_data(token, manager, paused), {}
        return render_user_data(boot_script, token, manager, paused), {}
    nonce = new_nonce()
    join_ticket = ticket(token, nonce)
    if boot_script is None:
        return render_ticket_start_user_data(host.join_urls, join_ticket, paused), {JOIN_NONCE_TAG: nonce}
    return render_ticket_user_data(boot_script, host.join_urls, join_ticket, paused), {JOIN_NONCE_TAG: nonce}


@dataclass(frozen=True, slots=True)
class JoiningMachine:
    """An instance of ours at a private address, as EC2 describes it now."""

    instance: Instance
    nonce: str  # its `JOIN_NONCE_TAG` ("" when it has none)


async def machines_at(host: JoinHost, address: str) -> tuple[JoiningMachine, ...]:
    """The pending or running instances of ours (ownership and deployment tags, checked again here)
    whose private IP is `address`: a fresh DescribeInstances. More than one can only be instances in
    two VPCs with overlapping ranges; the endpoint then answers none. Raises `EndpointError`."""
    filters = [
        *host._ownership_filters(),
        {"Name": "private-ip-address", "Values": [address]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    try:
        reservations = await host._pages("describe_instances", "Reservations", Filters=filters)
    except (ClientError, BotoCoreError) as exc:
        raise to_endpoint_error(host.endpoint, "DescribeInstances", exc) from None
    found = []
    for raw in (raw for res in reservations for raw in res.get("Instances", ())):
        instance = to_instance(raw)
        if instance is None or not host._owned(raw) or raw.get("PrivateIpAddress") != address:
            continue
        found.append(JoiningMachine(instance, instance.tags.get(JOIN_NONCE_TAG, "")))
    return tuple(found)


def join_urls(urls: Sequence[str]) -> tuple[str, ...]:
    """The join URLs, without blanks and duplicates, in order."""
    return tuple(dict.fromkeys(u.strip() for u in urls if u.strip()))
