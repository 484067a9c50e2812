"""`Ec2Transport`: one reused aiobotocore EC2 client with selective retries and EC2's clock, shared by
the daemon's EC2 adapter (`ec2.Ec2Cloud`) and the keeper's (`ec2_primaries.Ec2Primaries`).

Retries: botocore's own retries are off; tenacity retries (exponential back-off with jitter) only
throttling, 5xx other than capacity refusals, and connection errors (`ec2_support.is_transient`).

Clock: `now()` is EC2's own clock, learnt from the `Date` header of every response (see `ec2_clock`).

Counters in `stats` let a benchmark check the API calls each operation costs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError
from botocore.parsers import ResponseParserError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from swarm_autoscaler import __version__
from swarm_autoscaler.adapters.ec2_clock import Ec2Clock
from swarm_autoscaler.adapters.ec2_launch_token import LaunchTokens
from swarm_autoscaler.adapters.ec2_support import THROTTLING_CODES, chunks, is_transient, to_endpoint_error
from swarm_autoscaler.errors import ConfigurationError, EndpointError

# Appended to botocore's user agent: CloudTrail (and the lab's audit of IAM actions) can tell our calls.
PRODUCT_USER_AGENT = f"swarm-autoscaler/{__version__}"
DESCRIBE_IDS_BATCH = 200  # EC2's limit on values in one filter
_SENT = "swarm_autoscaler_sent"  # request context key: monotonic time the call started (for the clock)
# botocore retries nothing itself: tenacity retries, selectively (see `Ec2Transport._call`)
NO_SDK_RETRIES: dict[str, Any] = {"total_max_attempts": 1, "mode": "standard"}


async def open_client(
    service: str,
    *,
    region: str,
    endpoint: str | None,
    credentials: tuple[str | None, str | None],
    retries: dict[str, Any],
    read_timeout: float,
    connect_timeout: float | None = None,
) -> tuple[AsyncExitStack, Any]:
    """An aiobotocore client of `service` with the product's user agent, and the stack that closes it.
    The one place the AWS adapters (EC2, the Price List, SQS) create a client. Raises what the SDK
    raises (BotoCoreError, ValueError for a malformed endpoint)."""
    timeouts: dict[str, float] = {"read_timeout": read_timeout}
    if connect_timeout is not None:
        timeouts["connect_timeout"] = connect_timeout
    key, secret = credentials
    stack = AsyncExitStack()
    creator = get_session().create_client(
        service,
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=AioConfig(retries=retries, user_agent_extra=PRODUCT_USER_AGENT, **timeouts),
    )
    try:
        return stack, await stack.enter_async_context(creator)
    except BaseException:
        await stack.aclose()
        raise


class ClientLifetime:
    """The lifetime of one adapter's AWS client (`open_client`): `start()` opens it (each adapter's own),
    `close()` closes it, and `async with` does both."""

    _stack: AsyncExitStack | None = None
    _client: Any = None

    async def start(self) -> Self:
        raise NotImplementedError

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()


@dataclass
class Ec2Stats:
    """Counters since start. `api_calls` counts every HTTP request by operation (retries included);
    `launch_calls` the RunInstances requests; `instances_requested` the sum of counts asked of
    `launch`; `capacity_refusals` the RunInstances refused for lack of capacity in a zone;
    `partial_launches` those that gave fewer machines than asked; `quota_refusals` the refusals for an
    account quota, by (type, capacity, code); `throttled` the answers "slow down" (RequestLimitExceeded
    and kin) by operation, each retried; `new_id_not_found` the calls about a just-launched id that EC2
    did not know yet (retried)."""

    launch_calls: int = 0
    instances_requested: int = 0
    instances_launched: int = 0
    capacity_refusals: int = 0
    partial_launches: int = 0
    hostname_tag_failures: int = 0
    new_id_not_found: int = 0
    api_calls: Counter[str] = field(default_factory=Counter)
    quota_refusals: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    throttled: Counter[str] = field(default_factory=Counter)

    @property
    def total_api_calls(self) -> int:
        return sum(self.api_calls.values())


class Ec2Transport(ClientLifetime):
    """The EC2 client's lifetime, calls and clock. Subclasses add the operations they need."""

    def __init__(
        self,
        *,
        region: str,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        clock: Callable[[], float] | None = None,
        page_size: int = 1000,
        retry_attempts: int = 5,
        retry_initial: float = 0.5,
        retry_max: float = 20.0,
        timeout: float = 30.0,
    ) -> None:
        self._region = region
        self._endpoint_url = endpoint
        self.endpoint = endpoint or f"https://ec2.{region}.amazonaws.com"
        self._credentials = (access_key_id, secret_access_key)
        self.ec2_clock = Ec2Clock()
        # None in production: EC2's clock. Tests of the back-off step a clock of their own.
        self._clock = clock if clock is not None else self.ec2_clock.now
        self._page_size = page_size
        self._retry = (retry_attempts, retry_initial, retry_max)
        self._timeout = timeout
        self.stats = Ec2Stats()
        # Copies of our machines (same tags, another launch) are not ours: `ec2_launch_token`.
        self.launch_tokens = LaunchTokens()
        if not 5 <= self._page_size <= 1000:
            raise ConfigurationError(f"page_size must be within 5..1000 (EC2 limits), got {self._page_size}")
        if self._retry[0] < 1:
            raise ConfigurationError("retry_attempts must be at least 1")

    # ----------------------------------------------------------------------------------- lifetime

    async def start(self) -> Self:
        if self._client is not None:
            return self
        try:
            stack, self._client = await open_client(
                "ec2",
                region=self._region,
                endpoint=self._endpoint_url,
                credentials=self._credentials,
                retries=NO_SDK_RETRIES,
                read_timeout=self._timeout,
                connect_timeout=self._timeout,
            )
        except (BotoCoreError, ValueError) as exc:
            raise to_endpoint_error(self.endpoint, "creating the EC2 client", exc) from None
        self._client.meta.events.register("before-call.ec2", self._count_call)
        self._client.meta.events.register("after-call.ec2", self._note_date)
        self._stack = stack
        return self

    def _count_call(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        self.stats.api_calls[model.name] += 1
        context[_SENT] = self.ec2_clock.monotonic()

    def _note_date(
        self, http_response: Any, context: dict[str, Any], model: Any = None, parsed: Any = None, **_: Any
    ) -> None:
        """Every answer, error or not, tells EC2's time (botocore emits after-call for both), and
        whether EC2 asked us to slow down."""
        code = parsed.get("Error", {}).get("Code") if isinstance(parsed, dict) else None
        if code in THROTTLING_CODES and model is not None:
            self.stats.throttled[model.name] += 1
        received = self.ec2_clock.monotonic()
        sent = context.get(_SENT, received)
        self.ec2_clock.observe(http_response.headers.get("date"), sent, received)

    def now(self) -> float:
        """EC2's current time (seconds since the epoch): the time base of `Instance.launched_at`."""
        return self._clock()

    # ----------------------------------------------------------------------------------- calls

    def _retrying(self) -> AsyncRetrying:
        attempts, initial, maximum = self._retry
        return AsyncRetrying(
            retry=retry_if_exception(_worth_retrying),
            wait=wait_exponential_jitter(multiplier=initial, max=maximum, jitter=initial),
            stop=stop_after_attempt(attempts),
            reraise=True,
        )

    def _started(self) -> Any:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__} is not started: use `async with` or call start()")
        return self._client

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """One API call with selective retries. SDK exceptions pass through for the caller to sort,
        except an answer that is not EC2's (some other HTTP server): `EndpointError`."""
        client = self._started()
        with self._not_ec2(operation):
            async for attempt in self._retrying():
                with attempt:
                    result: dict[str, Any] = await getattr(client, operation)(**params)
                    return result
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _describe_ids(self, ids: list[str]) -> list[dict[str, Any]]:
        """The instances among `ids` that EC2 still knows (ids that do not exist are simply absent)."""
        found: list[dict[str, Any]] = []
        for batch in chunks(ids, DESCRIBE_IDS_BATCH):
            filters = [{"Name": "instance-id", "Values": batch}]
            reservations = await self._pages("describe_instances", "Reservations", Filters=filters)
            found.extend(raw for res in reservations for raw in res.get("Instances", ()))
        return found

    async def _pages(
        self, operation: str, key: str, page_size: int | None = None, **params: Any
    ) -> list[dict[str, Any]]:
        """Every item under `key` across all pages (the whole walk is retried if a page fails), pages of
        `page_size` (the client's page size when None: some operations allow less)."""
        client = self._started()
        with self._not_ec2(operation):
            async for attempt in self._retrying():
                with attempt:
                    items: list[dict[str, Any]] = []
                    pages: AsyncIterator[dict[str, Any]] = client.get_paginator(operation).paginate(
                        **params,
                        PaginationConfig={"PageSize": min(page_size or self._page_size, self._page_size)},
                    )
                    async for page in pages:
                        items.extend(page.get(key, ()))
                    return items
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    @contextmanager
    def _not_ec2(self, operation: str) -> Iterator[None]:
        """botocore cannot parse the answer: the endpoint is some other server (a web page, a proxy)."""
        try:
            yield
        except ResponseParserError:
            raise EndpointError(
                self.endpoint,
                f"{operation} failed: the answer is not the EC2 API's (not parseable); is this the EC2 endpoint?",
            ) from None


def _worth_retrying(exc: BaseException) -> bool:
    """Transient errors, and an answer botocore cannot parse: a loaded endpoint has sent a cut-short or
    garbled body mid-run (seen with moto under load). A server that is not EC2 at all answers the same
    way every time, so it still ends in `_not_ec2`'s one line, only after the retries."""
    return is_transient(exc) or isinstance(exc, ResponseParserError)
