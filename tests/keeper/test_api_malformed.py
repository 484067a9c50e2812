"""Every malformed request gets its documented 4xx, over every keeper route and the daemon's HTTP routes.

The requests are written as raw bytes on a TCP socket (what an attacker's own client sends: bearer
tokens that are not UTF-8, ids that break `model.ID_RULE` or are percent-encoded junk, `since=nan` or
`1e400`, bodies nested thousands deep, not UTF-8, not JSON, or the wrong type, a create naming a profile
the keeper does not know or saying more than a profile). Hypothesis draws them;
for each the service answers a 4xx, our middleware logs exactly one "request refused" line, the keeper
still answers /healthz, and nothing changed: no cluster created or ended, the redis keys (tokens,
budgets, usage) byte for byte the same, no credentials made. The keeper stands on fakes for EC2 and the
probe (tests/keeper/fakes.py) and a real redis-server for tokens, usage and budgets."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
import redis
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs
from tests.keeper.fakes import FakeHosts, FakeProbe, FakeWorkers, SharedLocks

from swarm_autoscaler.daemon.metrics import Metrics, build_app
from swarm_autoscaler.keeper.adapters.redis_budgets import RedisBudgets
from swarm_autoscaler.keeper.adapters.redis_tokens import RedisTokens
from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.credentials import InProcessCredentials, listing_token
from swarm_autoscaler.keeper.launches import Launches
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.limits import Limits
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.model import ID_PATTERN
from swarm_autoscaler.keeper.service import Keeper
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

ADMIN = "admin-token-of-the-malformed-test"
NOW = 1_800_000_000.0
# Every route the keeper serves, with the ids of a valid request (the test checks the table is complete).
ROUTES = {
    ("PUT", "/v1/clusters/{user_id}/{wallet_id}"),
    ("POST", "/v1/clusters/{user_id}/{wallet_id}/heartbeat"),
    ("GET", "/v1/clusters"),
    ("GET", "/v1/clusters/{user_id}/{wallet_id}"),
    ("DELETE", "/v1/clusters/{user_id}/{wallet_id}"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/clusters/{user_id}/{wallet_id}/credentials"),
    ("GET", "/v1/primaries/{cluster_id}/credentials"),
    ("GET", "/v1/primaries/{cluster_id}/instances"),
    ("POST", "/v1/primaries/{cluster_id}/launches"),
    ("POST", "/v1/primaries/{cluster_id}/starts"),
    ("POST", "/v1/users/{user_id}/token"),
    ("DELETE", "/v1/users/{user_id}/token"),
    ("GET", "/v1/wallets/{wallet_id}/budget"),
    ("PUT", "/v1/wallets/{wallet_id}/budget"),
    ("DELETE", "/v1/wallets/{wallet_id}/budget"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
}
GUARDED = sorted(r for r in ROUTES if r[1].startswith("/v1/"))
WITH_IDS = [r for r in GUARDED if "{" in r[1]]
VALID = {"user_id": "alice", "wallet_id": "w1", "cluster_id": "kc-0001"}


@dataclass
class Served:
    loop: asyncio.AbstractEventLoop
    keeper_port: int
    daemon_port: int
    hosts: FakeHosts
    redis: redis.Redis
    credentials: InProcessCredentials
    routes: set[tuple[str, str]]
    workers: FakeWorkers

    def state(self) -> Any:
        keys = sorted(self.redis.keys("*"))
        return (
            self.hosts.created,
            dict(self.hosts.clusters),
            list(self.hosts.terminate_calls),
            {k: self.redis.dump(k) for k in keys},
            dict(self.credentials._made),
            set(self.credentials._used),
            list(self.workers.launched),
        )


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    with RedisServer(password="pw-of-the-malformed-test") as server:
        name = "malformed"
        tokens, usage, budgets = (
            RedisTokens(server.url, name),
            RedisUsage(server.url, name),
            RedisBudgets(server.url, name),
        )
        hosts = FakeHosts()
        keeper = Keeper(
            hosts, FakeProbe(), SharedLocks(lambda: NOW).for_replica("a"), KeeperTiming(),
            interval=0.05, clock=lambda: NOW, limits=Limits(5, usage=usage, store=budgets),
        )  # fmt: skip
        credentials = InProcessCredentials(make_credentials)
        workers = FakeWorkers()
        launches = Launches(keeper, workers, types={"m5.large": ("on-demand",)}, maximum=5)
        app = build_keeper_app(
            keeper, ADMIN, KeeperMetrics(), usage=usage, credentials=credentials, tokens=tokens,
            launches=launches,
        )  # fmt: skip
        daemon = build_app(Metrics("malformed"), lambda: NOW, 10.0, clock=lambda: NOW)
        keeper_server, daemon_server = TestServer(app), TestServer(daemon)

        async def start() -> None:
            await keeper_server.start_server()
            await daemon_server.start_server()
            await budgets.set("w1", 10.0)
            await tokens.issue("alice")

        loop.run_until_complete(start())
        routes = {  # aiohttp adds a HEAD beside each GET: the same handler
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.resource is not None and r.method != "HEAD"
        }
        sync = redis.Redis.from_url(server.url)
        try:
            yield Served(
                loop, keeper_server.port, daemon_server.port, hosts, sync, credentials, routes, workers
            )  # type: ignore[arg-type]
        finally:

            async def stop() -> None:
                await keeper_server.close()
                await daemon_server.close()
                await keeper.stop()
                for store in (tokens, usage, budgets):
                    await store.close()

            loop.run_until_complete(stop())
            sync.close()
            loop.close()


async def _send(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def request(method: str, target: bytes, headers: list[bytes], body: bytes = b"") -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: keeper", b"Connection: close"]
    lines += headers
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def target(template: str, ids: dict[str, str], query: bytes = b"") -> bytes:
    path = template
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    return path.encode("utf-8", "surrogateescape") + (b"?" + query if query else b"")


def _no_crlf(value: bytes) -> bytes:
    return value.replace(b"\r", b"").replace(b"\n", b"")


ADMIN_HEADER = b"Authorization: Bearer " + ADMIN.encode()
bad_tokens = st.one_of(
    st.just(b""),  # no header
    st.binary(max_size=60).map(lambda b: b"Authorization: Bearer " + _no_crlf(b)),  # not UTF-8, NUL, ...
    st.text(max_size=60).map(lambda t: b"Authorization: Bearer " + _no_crlf(t.encode())),
    st.sampled_from(
        [
            b"Authorization: Basic YWRtaW46eA==",
            b"Authorization: Bearer",
            b"Authorization: bearer " + ADMIN.encode(),
        ]
    ),
    st.just(b"Authorization: Bearer " + ADMIN.encode() + b"\xff"),
)
bad_ids = st.one_of(
    st.text(min_size=1, max_size=80)
    .filter(lambda t: not ID_PATTERN.fullmatch(t))
    .map(lambda t: quote(t, safe="")),
    st.binary(min_size=1, max_size=20)
    .filter(lambda b: not ID_PATTERN.fullmatch(b.decode("utf-8", "replace")))
    .map(lambda b: "".join(f"%{x:02X}" for x in b)),
    st.sampled_from(["..", "%2e%2e", "a" * 65, "-a", "a%00", "%C0%AE", "a b"]),
)


def _not_finite_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return True
    return not math.isfinite(value)


bad_numbers = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "%ff", "0x10", "1,5", "%00"]),
    st.text(min_size=1, max_size=30).filter(_not_finite_number).map(lambda t: quote(t, safe="")),
)
deep = st.integers(min_value=20, max_value=200_000).map(lambda n: b"[" * n + b"]" * n)
bad_bodies = st.one_of(
    deep,
    deep.map(lambda d: b'{"budget_usd": ' + d + b"}"),
    st.binary(max_size=200).filter(lambda b: not b.strip().startswith(b"{")),
    st.sampled_from(
        [
            b'{"budget_usd": "12"x}',
            b'{"budget_usd": -1}',
            b'{"budget_usd": true}',
            b'{"budget_usd": 1e400}',
            b'{"budget_usd": null}',
            b'{"budget_usd": NaN}',
            b'{"budget_usd": Infinity}',
            b"{}",
            b"[]",
            b'{"budget_usd": [1]}',
            b'{"budget_usd": {"a": 1}}',
            b'{"budget_usd": ' + b"9" * 500 + b"}",
            b"\xff\xfe{}",
            b'{"budget_usd": 1' + b" " * 5000 + b"}",
        ]
    ),
)

# The launch route's body (`keeper.launches.LaunchBody`): a valid one with one thing wrong.
CLUSTER_HEADER = b"Authorization: Bearer " + listing_token(ADMIN, VALID["cluster_id"]).encode()
GOOD_LAUNCH: dict[str, Any] = {
    "instance_type": "m5.large",
    "count": 1,
    "client_token": "t1",
    "user_data": "#!/bin/bash",
}
launch_mistakes = st.sampled_from(
    [
        {"count": 0}, {"count": -1}, {"count": "1"}, {"count": 1.5}, {"count": True}, {"count": 10**6},
        {"instance_type": ""}, {"instance_type": "M5.LARGE"}, {"instance_type": "m5"}, {"instance_type": 5},
        {"market": "reserved"}, {"market": None}, {"subnet_id": "sg-1"}, {"subnet_id": "subnet-a b"},
        {"user_data": "#" * (16 * 1024 + 1)}, {"user_data": "\u00e9" * 8193}, {"user_data": ["x"]},
        {"client_token": ""}, {"client_token": "a" * 41}, {"client_token": "a b"}, {"client_token": None},
        {"labels": {"": "v"}}, {"labels": {"k": 1}}, {"labels": {"k": "\n"}}, {"labels": ["k"]},
        {"labels": {f"k{i}": "v" for i in range(31)}}, {"pool": "yes"}, {"deployment": "SWARM!"},
        {"primary_arn": "arn:aws:ec2:us-east-1:1:instance/i-1"}, {"image_id": "ami-1"},
        {"iam_instance_profile": "admin"}, {"cluster_id": "kc-0002"},
    ]
)  # fmt: skip
bad_launches = st.one_of(
    launch_mistakes.map(lambda change: json.dumps({**GOOD_LAUNCH, **change}).encode()),
    st.sampled_from(sorted(GOOD_LAUNCH))
    .map(lambda gone: json.dumps({k: v for k, v in GOOD_LAUNCH.items() if k != gone}).encode())
    .filter(lambda b: b"client_token" not in b or b"instance_type" not in b or b"count" not in b),
    st.just(json.dumps({**GOOD_LAUNCH, "user_data": "x" * 70_000}).encode()),  # over the body's limit
)

# The start route's body (`keeper.launches.StartBody`): {"instance_ids": [1 to 50 instance ids]}.
bad_starts = st.sampled_from(
    [
        {}, {"instance_ids": []}, {"instance_ids": "i-0123456789abcdef0"}, {"instance_ids": [1]},
        {"instance_ids": ["i-XYZ"]}, {"instance_ids": ["sg-01234567"]}, {"instance_ids": [None]},
        {"instance_ids": [f"i-{n:017x}" for n in range(51)]}, {"instance_ids": ["i-0123456789abcdef0"], "count": 9},
        {"instance_ids": ["i-0123456789abcdef0"], "cluster_id": "kc-0002"},
    ]
).map(lambda body: json.dumps(body).encode())  # fmt: skip


# A create's body: anything but nothing or {"profile": "<a profile the keeper knows>"} (it knows only
# `default` here): 400 for a body that is not exactly that shape, 422 for a profile it does not know.
bad_profiles = st.one_of(
    bad_bodies.filter(lambda b: b.strip() != b""),  # an empty body is a create of the default profile
    st.text(max_size=80).filter(lambda t: t != "default").map(lambda t: json.dumps({"profile": t}).encode()),
    st.sampled_from(
        [
            b'{"profile": 1}',
            b'{"profile": null}',
            b'{"profile": "default", "worker_image": "registry.example.com/evil:1.0"}',
            b'{"profile": "Default"}',
            rb'{"profile": "default\u0000"}',
            rb'{"profile": "\ud800"}',
        ]
    ),
)


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes]:
    """(what is wrong, the raw request): each is wrong in at least one way that its route reads."""
    junk = draw(st.lists(st.binary(min_size=1, max_size=30).map(_no_crlf).filter(bool), max_size=3))
    extra = [b"X-Junk-" + str(i).encode() + b": " + j for i, j in enumerate(junk)]
    kind = draw(st.sampled_from(["token", "id", "query", "body", "profile"]))
    if kind == "token":
        method, template = draw(st.sampled_from(GUARDED))
        token = draw(bad_tokens)
        return kind, request(method, target(template, VALID), [h for h in [token] if h] + extra)
    if kind == "id":
        method, template = draw(st.sampled_from(WITH_IDS))
        names = [n for n in VALID if "{" + n + "}" in template]
        ids = {**VALID, draw(st.sampled_from(names)): draw(bad_ids)}
        return kind, request(method, target(template, ids), [ADMIN_HEADER, *extra])
    if kind == "query":
        name = draw(st.sampled_from(["since", "until", "user_id", "wallet_id"]))
        value = draw(bad_ids if name.endswith("_id") else bad_numbers)
        query = f"{name}={value}".encode()
        return kind, request("GET", target("/v1/usage", {}, query), [ADMIN_HEADER, *extra])
    headers = [ADMIN_HEADER, b"Content-Type: application/json", *extra]
    if kind == "profile":
        body = draw(bad_profiles)
        return kind, request("PUT", target("/v1/clusters/{user_id}/{wallet_id}", VALID), headers, body)
    cluster_headers = [CLUSTER_HEADER, b"Content-Type: application/json", *extra]
    route = draw(st.sampled_from(["launches", "starts", "budget"]))
    if route == "launches":
        body = draw(st.one_of(bad_bodies, bad_launches))
        return kind, request(
            "POST", target("/v1/primaries/{cluster_id}/launches", VALID), cluster_headers, body
        )
    if route == "starts":
        body = draw(st.one_of(bad_bodies, bad_starts))
        return kind, request(
            "POST", target("/v1/primaries/{cluster_id}/starts", VALID), cluster_headers, body
        )
    body = draw(bad_bodies)
    return kind, request("PUT", target("/v1/wallets/{wallet_id}/budget", VALID), headers, body)


def test_the_table_names_every_route_the_keeper_serves(served: Served) -> None:
    assert served.routes == ROUTES


# The drawn requests are large on purpose (bodies of 200,000 brackets, 70 kB of user data): hypothesis
# warns when it builds the repr of such a draw (over 30 kB), and the suite's "error" filter would turn that
# warning, which says nothing about the keeper, into a failure (seen once under load).
_LARGE_DRAWS = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)


@_LARGE_DRAWS
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(malformed())
def test_every_malformed_request_gets_a_4xx_one_log_line_and_changes_nothing(
    served: Served, drawn: tuple[str, bytes]
) -> None:
    kind, raw = drawn
    before = served.state()
    with capture_logs() as logs:
        status, body = served.loop.run_until_complete(_send(served.keeper_port, raw))
    assert 400 <= status < 500, (kind, raw[:300], status, body[:300])
    refused = [e for e in logs if e.get("event") == "request refused"]
    ours = body.startswith(b'{"error"')
    assert len(refused) == (1 if ours else 0), (kind, logs)  # aiohttp's parser answers some itself
    assert ADMIN not in json.dumps(logs, default=str)
    health, _ = served.loop.run_until_complete(_send(served.keeper_port, request("GET", b"/healthz", [])))
    assert health in (200, 503)  # still running (503: no listing yet, the fakes never run one)
    assert served.state() == before


@_LARGE_DRAWS
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    path=st.one_of(st.sampled_from(["/healthz", "/metrics"]), bad_ids.map(lambda t: "/" + t)),
    query=st.one_of(st.just(""), bad_numbers.map(lambda v: "since=" + v)),
    junk=st.lists(st.binary(min_size=1, max_size=30).map(_no_crlf).filter(bool), max_size=3),
    body=st.one_of(st.just(b""), bad_bodies),
)
def test_the_daemon_s_routes_answer_malformed_requests_without_a_5xx(
    served: Served, method: str, path: str, query: str, junk: list[bytes], body: bytes
) -> None:
    """The daemon's /healthz and /metrics read no input; whatever comes, they answer as usual (a GET)
    or 4xx (another method, another path), and keep serving."""
    headers = [b"X-Junk: " + j for j in junk] + [b"Authorization: Bearer \xff\xfe"]
    raw = request(method, path.encode() + (b"?" + query.encode() if query else b""), headers, body)
    status, _ = served.loop.run_until_complete(_send(served.daemon_port, raw))
    usual = method == "GET" and path in ("/healthz", "/metrics")
    assert (usual and status == 200) or 400 <= status < 500, (method, path, status)  # 400: aiohttp's parser
    again, _ = served.loop.run_until_complete(_send(served.daemon_port, request("GET", b"/healthz", [])))
    assert again == 200


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (request("GET", b"/v1/clusters", [b"Authorization: Bearer \xff\xfe\xfd"]), 401),
        (request("GET", b"/v1/primaries/kc-0001/credentials", [b"Authorization: Bearer \xc3\x28"]), 401),
        (request("GET", b"/v1/usage?since=nan", [ADMIN_HEADER]), 400),
        (request("GET", b"/v1/usage?until=1e400", [ADMIN_HEADER]), 400),
        (request("PUT", b"/v1/wallets/w1/budget", [ADMIN_HEADER], b"[" * 100_000 + b"]" * 100_000), 400),
    ],
)
def test_the_attacks_named_in_the_issue_get_their_4xx(served: Served, raw: bytes, status: int) -> None:
    """Each used to answer 500 with a traceback (the security review): a token that is not UTF-8 (`.encode()` on
    the header), `since=nan` / `1e400` (`math.floor` of them), a deeply nested body (`RecursionError`)."""
    got, body = served.loop.run_until_complete(_send(served.keeper_port, raw))
    assert got == status, body[:300]
    assert b"Traceback" not in body


def test_a_well_formed_request_is_answered(served: Served) -> None:
    """The other side: the same raw client with a valid request gets its 200 (the 4xx above are not
    the server refusing everything)."""
    status, body = served.loop.run_until_complete(
        _send(served.keeper_port, request("GET", b"/v1/wallets/w1/budget", [ADMIN_HEADER]))
    )
    assert status == 200 and b"10.0" in body
