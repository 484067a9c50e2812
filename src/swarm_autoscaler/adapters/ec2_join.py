"""The EC2 side of joining, for `Ec2Cloud`: the join in each launch's (or warm-pool start's) user data,
and the fresh read the join endpoint makes of the machine asking for the swarm join token.

Without join URLs (`AUTOSCALER_EC2_JOIN_URL` unset) the user data carries `docker swarm join --token`
as it always did. With them it carries a join ticket instead (`adapters.join_tickets`), and the
launch's instances get the ticket's nonce as the tag `JOIN_NONCE_TAG`: one nonce per RunInstances (all
its instances share one user data) or per warm-pool start. What binds a ticket to one machine is the
endpoint's check of the source address (`daemon.join`), not the nonce.

`AUTOSCALER_EC2_JOIN_URL=auto` (`JoinUrls.managers`): the URLs are every manager's address as swarm
advertises it to workers (`Orchestrator.manager_addresses`), at the daemon's join port
(`AUTOSCALER_EC2_JOIN_PORT`, TLS), read when a launch renders its user data (managers come and go), from
the read its `join_command` made. The user data also carries the pin of the join endpoint's key for the
token read then (`join_tls.join_pin`), which the boot's fetch checks.
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
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG, JOIN_PATH, new_nonce, ticket
from swarm_autoscaler.adapters.join_tls import join_pin
from swarm_autoscaler.core.model import Instance
from swarm_autoscaler.errors import ConfigurationError

# What the start-up size check renders `auto` with: swarm's advice is at most 7 managers; a launch whose
# user data is over EC2's limit after all is refused then, with its own message (`_prepare_launch`).
_WORST_MANAGERS = 9
_WORST_HOST = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]"


@dataclass(frozen=True, slots=True)
class JoinUrls:
    """Where machines post their join ticket: the `fixed` URLs, or, with `managers` set (`auto`), every
    manager's address at `port`, read at each launch. Neither: no join tickets (`on` is False)."""

    fixed: tuple[str, ...] = ()
    managers: Callable[[], Awaitable[tuple[str, ...]]] | None = None
    port: int = 0

    @property
    def on(self) -> bool:
        return bool(self.fixed) or self.managers is not None

    def worst_case(self) -> tuple[str, ...]:
        """The URLs the start-up check of user data sizes renders with (`boot_scripts.check_user_data`)."""
        if self.managers is None:
            return self.fixed
        return (f"https://{_WORST_HOST}:65535{JOIN_PATH}",) * _WORST_MANAGERS

    async def resolve(self) -> tuple[str, ...]:
        """The URLs for a launch now. `auto` with no manager address raises `ConfigurationError`, and
        what `managers` raises (`EndpointError`)."""
        if self.managers is None:
            return self.fixed
        urls = auto_join_urls(await self.managers(), self.port)
        if not urls:
            raise ConfigurationError(
                "AUTOSCALER_EC2_JOIN_URL=auto: swarm names no reachable manager address (docker's "
                "ManagerStatus.Addr) to give machines as a join URL; list the join URLs instead"
            )
        return urls


def auto_join_urls(managers: Sequence[str], port: int) -> tuple[str, ...]:
    """`https://<host>:<port>/v1/join` for each manager address `host:swarm port` (an IPv6 host keeps its
    brackets), in order, without duplicates or unspecified addresses."""
    urls = []
    for address in managers:
        host = address.rpartition(":")[0] if ":" in address else address
        if host and host not in ("0.0.0.0", "[::]"):
            urls.append(f"https://{host}:{port}{JOIN_PATH}")
    return tuple(dict.fromkeys(urls))


class JoinHost(Protocol):
    """What these calls need of `Ec2Cloud`."""

    endpoint: str
    join_urls: JoinUrls
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
    if not host.join_urls.on:
        if boot_script is None:
            return render_start_user_data(token, manager, paused), {}
        return render_user_data(boot_script, token, manager, paused), {}
    urls = await host.join_urls.resolve()  # after join_command: `auto` reads the managers it just read
    nonce = new_nonce()
    join_ticket, pin = ticket(token, nonce), join_pin(token)
    if boot_script is None:
        return render_ticket_start_user_data(urls, join_ticket, paused, pin=pin), {JOIN_NONCE_TAG: nonce}
    return render_ticket_user_data(boot_script, urls, join_ticket, paused, pin=pin), {JOIN_NONCE_TAG: nonce}


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


def join_urls(urls: Sequence[str] | JoinUrls) -> JoinUrls:
    """The join URLs: given as `JoinUrls`, or as fixed URLs (without blanks and duplicates, in order)."""
    if isinstance(urls, JoinUrls):
        return urls
    return JoinUrls(tuple(dict.fromkeys(u.strip() for u in urls if u.strip())))
