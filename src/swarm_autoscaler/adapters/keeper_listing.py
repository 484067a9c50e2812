"""`KeeperListedCloud`: the EC2 adapter of a keeper cluster's autoscaler, reading its instances from the
keeper instead of calling DescribeInstances itself (over https://, verified with
`AUTOSCALER_EC2_LISTING_CA_FILE` when the keeper names its CA, else with the system's CAs).

Every cluster's autoscaler listing its own instances every tick (5 s) spent the account's refill rate for
DescribeInstances (20 per second) at about 100 clusters, throttling every other tool in the account. The
keeper lists every cluster's machines in one paged DescribeInstances per interval anyway (it watches
their primaries); it keeps each cluster's workers from that listing and serves them at
`GET /v1/primaries/<cluster id>/instances` (bearer: the cluster's listing token, a read-only token of
that listing only). This adapter reads them there and checks each instance's ownership tags again, as
`Ec2Cloud.list_instances` does; everything else (launch, start, stop, terminate, the catalogue) goes to
EC2 as before, with the cluster's own permissions.

A listing older than `max_age` (the keeper stuck, or no replica listing) or an unreadable keeper does not
stop the cluster: a cluster must keep scaling while its keeper is down or restarting (work reaches its
scheduler directly). The adapter then lists from EC2 itself, as `Ec2Cloud` does, at most once every
`fallback_every` seconds (the last direct listing is reused in between: it is never older than what a
keeper listing may be), with one warning line when the keeper is lost and one when it is back. Only
when EC2 is unreachable as well is it an `EndpointError`: the tick acts on nothing. Launches since the
listing are covered as with EC2's own eventual consistency (`daemon.loop.InFlightCloud`).

**Starts of warm-pool workers go through the keeper too** (`POST /v1/primaries/<id>/starts`): the
autoscaler rewrites the stopped worker's user data and tags it (its own worker, with its own role), then
the keeper starts it within the cluster's maximum (`keeper.launches`).

**Launches go through the keeper**, never to EC2: the primaries' IAM role has no `ec2:RunInstances`
(a user's code on the primary holds that role: docs/security.md, "Tenant credentials: the decision").
Each RunInstances `Ec2Cloud.launch` would send (one subnet, one capacity, up to n machines) becomes a
`POST /v1/primaries/<cluster id>/launches` (the listing URL's sibling, the same bearer) whose JSON body
carries what the autoscaler chooses: type, count, market, subnet, user data (with the join), node labels,
warm pool or not, an idempotency token, the join ticket's nonce (`keeper.launches`). The keeper enforces the cluster's scope,
maximum, budget and types and launches with its own AMI, network and tags. Its answers are read as EC2's
would be: the instances (then the hostname tag, on the worker the policy lets this primary retag);
EC2's refusal forwarded with its code (a capacity or quota code backs off as before); a refusal of the
keeper's own (over the maximum or the budget, a type or subnet it does not offer: 402, 403, 409, 429)
backs the (type, capacity) off in every subnet for the usual back-off and ends this launch (one warning
line), which the planner treats as a capacity refusal; a keeper that cannot be reached or answers
otherwise is a failed launch (`LaunchResult.error`), and the next tick tries again.

The listing also names the cluster's primary (its instance ARN, `primary_arn`), which the keeper puts on
every worker (`ec2.PRIMARY_TAG`): the primaries' policy lets a primary act only on workers naming it.
Until a listing named it, a launch is not sent (the keeper would refuse it too).
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import aiohttp
import structlog
from botocore.exceptions import ClientError

from swarm_autoscaler.adapters.ec2 import Ec2Cloud, _Run
from swarm_autoscaler.adapters.ec2_support import LABEL_TAG_PREFIX, to_instance
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG
from swarm_autoscaler.core.backoff import ON_DEMAND, SPOT
from swarm_autoscaler.core.model import Instance
from swarm_autoscaler.core.ports import LaunchResult
from swarm_autoscaler.errors import EndpointError

SETTING = "AUTOSCALER_EC2_LISTING_URL"
KEEPER_REFUSALS = frozenset({402, 403, 409, 429})  # the cluster's budget, types, state or maximum
log = structlog.get_logger("swarm_autoscaler.adapters.keeper_listing")


class KeeperRefusedError(Exception):
    """The keeper refused a launch for the cluster's own limits (`status`: 402, 403, 409 or 429)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


def _keeper_error(code: str, message: str, operation: str = "RunInstances") -> ClientError:
    """A failed launch (or start) as botocore raises EC2's, so `Ec2Cloud` reads it with EC2's rules."""
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


class KeeperListedCloud(Ec2Cloud):
    """`Ec2Cloud` whose `list_instances` reads the keeper's listing of this cluster (see module doc)."""

    def __init__(
        self,
        *,
        listing_url: str,
        listing_token: str,
        listing_ca_file: str | None = None,
        max_age: float = 60.0,
        timeout: float = 10.0,
        fallback_every: float = 15.0,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self._fallback_every = min(fallback_every, max_age)
        self._direct: tuple[float, tuple[Instance, ...]] | None = None  # (read at, what EC2 listed)
        self.lost: str | None = None  # why the keeper's listing is not used, while it is not
        self.fallbacks = 0  # direct DescribeInstances listings made because the keeper's was unusable
        self.listing_url = listing_url
        self._listing_token = listing_token
        self._listing_ca_file = listing_ca_file
        self._max_age = max_age
        self._listing_timeout = aiohttp.ClientTimeout(total=timeout)
        self._http: aiohttp.ClientSession | None = None
        self.listings = 0  # reads from the keeper (none of them a call to EC2)

    async def launch(
        self, type_name: str, count: int, labels: Mapping[str, str], pool: bool = False
    ) -> LaunchResult:
        """`Ec2Cloud.launch`, once the keeper's listing has named this cluster's primary (see the module
        docstring): until then a failure, as the primaries' IAM policy would refuse the launch."""
        if count > 0 and not self.primary_arn:
            why = "the keeper's listing has not named this cluster's primary yet (its ARN tags every worker)"
            return LaunchResult(error=why)
        return await super().launch(type_name, count, labels, pool)

    @property
    def launch_url(self) -> str:
        """The keeper's launch route for this cluster: the listing URL's sibling."""
        base = self.listing_url.rstrip("/")
        return base.removesuffix("/instances") + "/launches"

    async def _launch_in(
        self, run: _Run, subnet: str, ask: int, params: dict[str, Any], capacity: str
    ) -> int | None:
        try:
            return await super()._launch_in(run, subnet, ask, params, capacity)
        except KeeperRefusedError as exc:
            log.warning(
                "the keeper refused a launch: the type waits out its back-off",
                type=run.type_name, capacity=capacity, status=exc.status, why=exc.detail,
            )  # fmt: skip
            self._refuse(run, self._subnets, capacity)
            return None

    async def _run_instances(
        self, type_name: str, subnet: str, count: int, params: dict[str, Any], capacity: str = ON_DEMAND
    ) -> list[Instance]:
        """One launch through the keeper (see the module docstring), in place of RunInstances."""
        instance_tags = next(
            s["Tags"] for s in params["TagSpecifications"] if s["ResourceType"] == "instance"
        )
        labels = {
            t["Key"][len(LABEL_TAG_PREFIX) :]: t["Value"]
            for t in instance_tags
            if t["Key"].startswith(LABEL_TAG_PREFIX)
        }
        body = {
            "instance_type": type_name,
            "count": count,
            "market": "spot" if capacity == SPOT else "on-demand",
            "subnet_id": subnet,
            "user_data": params["UserData"],
            "client_token": uuid.uuid4().hex,
            "labels": labels,
            "pool": params.get("InstanceInitiatedShutdownBehavior") == "stop",
            "deployment": self.deployment,
        }
        nonce = next((t["Value"] for t in instance_tags if t["Key"] == JOIN_NONCE_TAG), "")
        if nonce:  # with AUTOSCALER_EC2_JOIN_URL: the user data carries a ticket, the keeper tags its nonce
            body["join_nonce"] = nonce
        self.stats.launch_calls += 1
        answer = await self._post_launch(body)
        raws = [dict(raw, LaunchTime=datetime.fromisoformat(raw["LaunchTime"])) for raw in answer]
        self.launch_tokens.answered(raws)  # the keeper forwards EC2's ClientToken (`ec2_launch_token`)
        instances = [i for i in (to_instance(raw) for raw in raws) if i]
        self.stats.instances_launched += len(instances)
        for instance in instances:
            await self._tag_hostname(instance)
        return instances

    async def _post_launch(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The keeper's answer: its instances; `KeeperRefusedError` for its own refusal; a ClientError
        (as botocore raises EC2's) for EC2's refusal it forwards or when the keeper cannot be used."""
        return await self._post(self.launch_url, body, "instances")

    @property
    def start_url(self) -> str:
        """The keeper's start route for this cluster: the listing URL's sibling."""
        return self.listing_url.rstrip("/").removesuffix("/instances") + "/starts"

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """StartInstances goes to the keeper's start route, which starts the warm pool's workers within
        the cluster's maximum (the primaries' role holds no `ec2:StartInstances`); every other call goes
        to EC2 as before. A refusal of the keeper's own reads as a capacity refusal (`ec2_pool` backs
        the pool's (type, subnet) off, and the planner launches instead, through the launch route)."""
        if operation != "start_instances":
            return await super()._call(operation, **params)
        ids = list(params["InstanceIds"])
        try:
            await self._post(self.start_url, {"instance_ids": ids}, "started")
        except KeeperRefusedError as exc:
            log.warning("the keeper refused a start: the machines wait out the back-off",
                        ids=ids, status=exc.status, why=exc.detail)  # fmt: skip
            message = f"the keeper refused the start ({exc.status}): {exc.detail}"
            raise _keeper_error("InsufficientInstanceCapacity", message, "StartInstances") from None
        return {}

    async def _post(self, url: str, body: dict[str, Any], key: str) -> list[Any]:
        """POST `body` to one of the keeper's routes for this cluster; the answer's list under `key`
        (see `_post_launch` for the errors)."""
        http = self._session()
        headers = {"Authorization": f"Bearer {self._listing_token}"}
        try:
            async with http.post(url, json=body, headers=headers) as response:
                status = response.status
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _keeper_error("KeeperUnreachable", f"{url}: {exc!r}") from None
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise _keeper_error("KeeperAnswer", f"{url} answered {status}: {text[:200]}")
        if status == 200 and isinstance(answer.get(key), list):
            return list(answer[key])
        detail = str(answer.get("error", ""))[:300]
        if status == 502 and answer.get("ec2_code"):
            raise _keeper_error(str(answer["ec2_code"]), detail)
        if status in KEEPER_REFUSALS:
            raise KeeperRefusedError(status, detail)
        raise _keeper_error("KeeperAnswer", f"{url} answered {status}: {detail}")

    async def list_instances(self) -> tuple[Instance, ...]:
        try:
            found = await self._from_keeper()
        except EndpointError as exc:
            return await self._from_ec2(exc.detail)
        if self.lost is not None:
            log.info("the keeper's listing is back", url=self.listing_url)
            self.lost, self._direct = None, None
        return found

    async def _from_ec2(self, why: str) -> tuple[Instance, ...]:
        """The cluster's own listing while the keeper's is unusable, at most once per `fallback_every`."""
        if self.lost is None:
            log.warning(
                "the keeper's listing is unusable: listing from EC2 directly until it is back",
                url=self.listing_url, why=why, every_s=self._fallback_every,
            )  # fmt: skip
        self.lost = why
        if self._direct is not None and self.now() - self._direct[0] < self._fallback_every:
            return self._direct[1]
        found = await super().list_instances()  # an EndpointError here: the tick acts on nothing
        self.fallbacks += 1
        self._direct = (self.now(), found)
        return found

    async def _from_keeper(self) -> tuple[Instance, ...]:
        body = await self._read()
        try:
            listed_at = float(body["listed_at"])
            raws = [
                dict(raw, LaunchTime=datetime.fromisoformat(raw["LaunchTime"])) for raw in body["instances"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise EndpointError(self.listing_url, f"not a listing ({exc!r})", SETTING) from None
        arn = body.get("primary_arn")
        if isinstance(arn, str) and arn.startswith("arn:") and arn != self.primary_arn:
            log.info("launches carry this cluster's primary", primary_arn=arn)
            self.primary_arn = arn  # the only workers the primaries' IAM policy lets this primary touch
        age = self.now() - listed_at
        if age > self._max_age:
            raise EndpointError(self.listing_url, f"the keeper's listing is {age:.0f}s old", SETTING)
        self.listings += 1
        owned = (raw for raw in raws if self._owned(raw))
        found = (self._with_ownership(to_instance(raw)) for raw in owned)
        return tuple(sorted((i for i in found if i is not None), key=lambda i: (i.launched_at, i.id)))

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # https:// is verified (with the keeper's CA when given, else the system's): the cluster's
            # token, the listing and the launches must not go to whoever answers in the keeper's place.
            try:
                tls = ssl.create_default_context(cafile=self._listing_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise EndpointError(self.listing_url, f"its CA file is unreadable ({exc})", SETTING) from None
            connector = aiohttp.TCPConnector(ssl=tls)
            self._http = aiohttp.ClientSession(timeout=self._listing_timeout, connector=connector)
        return self._http

    async def _read(self) -> dict[str, Any]:
        http = self._session()
        headers = {"Authorization": f"Bearer {self._listing_token}"}
        try:
            async with http.get(self.listing_url, headers=headers) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise EndpointError(self.listing_url, f"answered {response.status}: {text}", SETTING)
                body = await response.json()
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise EndpointError(self.listing_url, f"unreadable ({exc!r})", SETTING) from None
        if not isinstance(body, dict):
            raise EndpointError(self.listing_url, "not a listing (no JSON object)", SETTING)
        return body

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        await super().close()
