"""`SqsInterruptions`: EC2's notices that it takes a machine back, read from an SQS queue.

EventBridge rules (see docs/spot.md) put three kinds of event in the queue, as the event JSON itself:
"EC2 Spot Instance Interruption Warning" (two minutes before EC2 takes a spot machine), "EC2 Instance
Rebalance Recommendation" (a spot machine at raised risk, usually earlier) and an "AWS Health Event" of
EC2's scheduled changes (a retirement or maintenance naming instances). Any other well-formed event (an
"EC2 Instance State-change Notification" routed to the same queue, for example) is counted as ignored.

What one `poll_once` does, in order, so that no notice is lost:

1. receive a batch of messages (long poll: `wait_seconds`);
2. parse each; a message that is not such an event (not JSON, no instance id) is logged, counted as
   malformed and deleted: it would come back forever and teaches nothing;
3. re-read the instances named from EC2 and keep those that carry our ownership tags, live, launched
   (or started) before the notice; tag each with the notice's time (`INTERRUPTED_TAG`, read back into
   `Instance.interrupted_at` by every listing, so a restart finds it: the queue gives a notice once;
   a rebalance recommendation under `REBALANCE_TAG`, read into `Instance.rebalance_at`: advice only);
4. delete the messages handled. When EC2 cannot be read or tagged, nothing is deleted: the messages
   become visible again after the queue's visibility timeout and are handled then.

A notice for an instance that is not ours (another cluster's, or gone) is deleted and counted as
`not-ours`: use one queue per daemon. Calls are retried like EC2's (tenacity, throttling, 5xx and
connection errors only). `run` long-polls until cancelled; one failing poll is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

import structlog
from botocore.exceptions import BotoCoreError, ClientError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from swarm_autoscaler.adapters.ec2_support import (
    INTERRUPTED_TAG,
    REBALANCE_TAG,
    is_transient,
    to_endpoint_error,
    to_instance,
)
from swarm_autoscaler.adapters.ec2_transport import NO_SDK_RETRIES, ClientLifetime, open_client
from swarm_autoscaler.errors import EndpointError

log = structlog.get_logger("swarm_autoscaler.adapters.ec2_interruptions")

SPOT_INTERRUPTION = "spot-interruption"
REBALANCE = "rebalance"
SCHEDULED_CHANGE = "scheduled-change"
IGNORED = "ignored"
MALFORMED = "malformed"
NOT_OURS = "not-ours"
KINDS = (SPOT_INTERRUPTION, REBALANCE, SCHEDULED_CHANGE, IGNORED, MALFORMED, NOT_OURS)

_DETAIL_TYPES = {
    "EC2 Spot Instance Interruption Warning": SPOT_INTERRUPTION,
    "EC2 Instance Rebalance Recommendation": REBALANCE,
}
_LIVE = ("pending", "running")


@dataclass(frozen=True, slots=True)
class Notice:
    """EC2 will take `instance_id` back: `kind` of notice, given at `at` (epoch seconds)."""

    instance_id: str
    kind: str
    at: float


class Malformed(ValueError):
    """A message that is not an event this adapter knows how to read."""


def parse_event(body: str) -> tuple[Notice, ...]:
    """The notices in one message body (an EventBridge event as JSON). Empty for a well-formed event
    of another kind (ignored); raises `Malformed` for anything else."""
    try:
        event = json.loads(body)
    except ValueError:
        raise Malformed("not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        raise Malformed("not an EventBridge event (no detail object)")
    at = _event_time(event.get("time"))
    detail: dict[str, Any] = event["detail"]
    kind = _DETAIL_TYPES.get(str(event.get("detail-type", "")))
    if kind is not None:
        instance_id = detail.get("instance-id")
        if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
            raise Malformed(f"{event.get('detail-type')} without an instance id")
        return (Notice(instance_id, kind, at),)
    if event.get("source") == "aws.health" and detail.get("service") == "EC2":
        if detail.get("eventTypeCategory") != "scheduledChange":
            return ()
        entities = detail.get("affectedEntities")
        if not isinstance(entities, list):
            raise Malformed("AWS Health event without affected entities")
        ids = [e.get("entityValue") for e in entities if isinstance(e, dict)]
        return tuple(
            Notice(i, SCHEDULED_CHANGE, at) for i in ids if isinstance(i, str) and i.startswith("i-")
        )
    if "detail-type" not in event:
        raise Malformed("not an EventBridge event (no detail-type)")
    return ()


def _event_time(text: object) -> float:
    if not isinstance(text, str):
        raise Malformed("no event time")
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise Malformed(f"event time {text!r} is not ISO 8601") from None


class OwnedInstances(Protocol):
    """What the adapter needs of the EC2 adapter (`Ec2Cloud`): its ownership check and raw reads."""

    endpoint: str

    def _owned(self, raw: Mapping[str, Any]) -> bool: ...

    async def _describe_ids(self, ids: list[str]) -> list[dict[str, Any]]: ...

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]: ...


async def mark_interrupted(cloud: OwnedInstances, notices: Sequence[Notice]) -> frozenset[str]:
    """Tag every owned, live instance among `notices` with its earliest notice's time (once: a machine
    already tagged keeps its first notice). Returns the ids that are ours. A notice given before the
    machine's launch (or last start from the warm pool) is stale and skipped. A rebalance
    recommendation is advice, not a notice (core/interrupt.py): it is kept under its own tag
    (`REBALANCE_TAG`). Raises EndpointError."""
    earliest: dict[tuple[str, str], float] = {}
    for notice in notices:
        tag = REBALANCE_TAG if notice.kind == REBALANCE else INTERRUPTED_TAG
        key = (notice.instance_id, tag)
        earliest[key] = min(notice.at, earliest.get(key, notice.at))
    if not earliest:
        return frozenset()
    try:
        found = await cloud._describe_ids(sorted({i for i, _ in earliest}))
        owned = [raw for raw in found if cloud._owned(raw)]
        for raw in owned:
            instance = to_instance(raw)
            if instance is None or raw["State"]["Name"] not in _LIVE:
                continue
            for tag, noted in (
                (INTERRUPTED_TAG, instance.interrupted_at),
                (REBALANCE_TAG, instance.rebalance_at),
            ):
                at = earliest.get((instance.id, tag))
                if at is None or noted is not None or at < instance.launched_at:
                    continue
                value = [{"Key": tag, "Value": f"{at:.0f}"}]
                await cloud._call("create_tags", Resources=[instance.id], Tags=value)
    except (ClientError, BotoCoreError) as exc:
        raise to_endpoint_error(cloud.endpoint, "tagging interrupted instances", exc) from None
    return frozenset(raw["InstanceId"] for raw in owned)


@dataclass
class PollResult:
    """What one poll saw: notices for our machines, and the messages by kind (see `KINDS`)."""

    ours: tuple[Notice, ...] = ()
    counts: dict[str, int] | None = None


class SqsInterruptions(ClientLifetime):
    """Reads the interruption queue and tags the machines it names (see the module docstring)."""

    def __init__(
        self,
        *,
        queue_url: str,
        cloud: OwnedInstances,
        region: str,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        wait_seconds: int = 20,
        on_message: Callable[[str], None] = lambda _kind: None,
        retry_attempts: int = 5,
        retry_initial: float = 0.5,
        retry_max: float = 20.0,
    ) -> None:
        parts = urlsplit(queue_url)
        self.queue_url = queue_url
        self.endpoint = f"{parts.scheme}://{parts.netloc}"  # a queue URL names its service endpoint
        self._cloud = cloud
        self._region = region
        self._credentials = (access_key_id, secret_access_key)
        self._wait = wait_seconds
        self._on_message = on_message
        self._retry = (retry_attempts, retry_initial, retry_max)

    async def start(self) -> Self:
        if self._client is not None:
            return self
        self._stack, self._client = await open_client(
            "sqs",
            region=self._region,
            endpoint=self.endpoint,
            credentials=self._credentials,
            retries=NO_SDK_RETRIES,
            read_timeout=self._wait + 10,
        )
        return self

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        if self._client is None:
            raise RuntimeError("SqsInterruptions is not started: use `async with` or call start()")
        attempts, initial, maximum = self._retry
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential_jitter(multiplier=initial, max=maximum, jitter=initial),
            stop=stop_after_attempt(attempts),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    result: dict[str, Any] = await getattr(self._client, operation)(
                        QueueUrl=self.queue_url, **params
                    )
                    return result
        except (ClientError, BotoCoreError) as exc:
            raise to_endpoint_error(self.endpoint, f"SQS {operation}", exc) from None
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def check(self) -> None:
        """A start-up check: the queue exists and these credentials may read it. Raises EndpointError."""
        await self._call("get_queue_attributes", AttributeNames=["VisibilityTimeout"])

    async def poll_once(self, wait_seconds: int | None = None) -> PollResult:
        """Receive one batch, tag the machines it names, delete what was handled. Raises EndpointError
        (SQS or EC2 unreachable); then the messages not yet deleted come back later."""
        wait = self._wait if wait_seconds is None else wait_seconds
        answer = await self._call("receive_message", MaxNumberOfMessages=10, WaitTimeSeconds=wait)
        counts: dict[str, int] = {}
        handled: list[str] = []
        parsed: list[tuple[str, tuple[Notice, ...]]] = []
        for message in answer.get("Messages", ()):
            receipt = message["ReceiptHandle"]
            try:
                notices = parse_event(message.get("Body", ""))
            except Malformed as exc:
                log.warning("malformed message in the interruption queue, deleted", reason=str(exc))
                counts[MALFORMED] = counts.get(MALFORMED, 0) + 1
                handled.append(receipt)
                continue
            parsed.append((receipt, notices))
        all_notices = [n for _, notices in parsed for n in notices]
        ours = await mark_interrupted(self._cloud, all_notices)  # raises: nothing parsed is deleted
        for receipt, notices in parsed:
            kinds = [n.kind if n.instance_id in ours else NOT_OURS for n in notices] or [IGNORED]
            for kind in kinds:
                counts[kind] = counts.get(kind, 0) + 1
            handled.append(receipt)
        for receipt in handled:
            await self._call("delete_message", ReceiptHandle=receipt)
        for kind, count in counts.items():
            for _ in range(count):
                self._on_message(kind)
        mine = tuple(n for n in all_notices if n.instance_id in ours)
        if mine:
            log.warning(
                "EC2 gave notice it takes machines back",
                instances=sorted({n.instance_id for n in mine}),
                kinds=sorted({n.kind for n in mine}),
            )
        return PollResult(mine, counts)

    async def run(self, pause: float = 5.0) -> None:
        """Long-poll until cancelled; a failing poll is logged and retried after `pause` seconds."""
        while True:
            try:
                await self.poll_once()
            except EndpointError as exc:
                log.error("interruption queue unreadable", queue=self.queue_url, error=exc.detail)
                await asyncio.sleep(pause)
            except Exception as exc:  # the poller never dies, like the loop
                log.exception("interruption poll failed", error=str(exc))
                await asyncio.sleep(pause)
