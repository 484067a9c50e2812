"""Cluster profiles through the keeper's API (aiohttp's test client over the keeper on fakes for EC2
and the probe, tests/keeper/fakes.py): a create names a profile in its body, the cluster keeps it and
shows it, a create naming none gets the default (as before profiles), an unknown profile is 422 naming
the known ones, a profile other than the live cluster's is 409, and a body that is not exactly
`{"profile": "<name>"}` is 400; none of the refused requests launches or touches anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from tests.keeper.fakes import FakeHosts, FakeProbe, SharedLocks

from swarm_autoscaler.keeper.api import build_keeper_app
from swarm_autoscaler.keeper.lifecycle import KeeperTiming
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.service import Keeper

TOKEN = "s3cret-token-of-the-profiles-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = 1_800_000_000.0
Client = TestClient  # type: ignore[type-arg]


@pytest.fixture
async def api() -> AsyncIterator[tuple[Client, FakeHosts]]:
    hosts = FakeHosts()
    keeper = Keeper(
        hosts, FakeProbe(), SharedLocks(lambda: NOW).for_replica("a"), KeeperTiming(),
        interval=0.05, clock=lambda: NOW, profiles=("default", "geo", "gpu"),
    )  # fmt: skip
    async with TestClient(TestServer(build_keeper_app(keeper, TOKEN, KeeperMetrics()))) as client:
        yield client, hosts
    await keeper.stop()


async def _put(client: Client, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    response = await client.put(path, headers=AUTH, **kwargs)
    return response.status, await response.json()


async def test_a_create_names_its_profile_and_the_cluster_keeps_and_shows_it(
    api: tuple[Client, FakeHosts],
) -> None:
    client, hosts = api
    status, body = await _put(client, "/v1/clusters/alice/w1", json={"profile": "geo"})
    assert (status, body["profile"]) == (201, "geo")
    assert hosts.clusters[body["id"]].profile == "geo"  # what `create` was asked for: the launch's
    again, same = await _put(client, "/v1/clusters/alice/w1", json={"profile": "geo"})
    assert (again, same["id"]) == (200, body["id"])
    unnamed, got = await _put(client, "/v1/clusters/alice/w1")  # naming none: whatever it runs
    assert (unnamed, got["id"], got["profile"]) == (200, body["id"], "geo")
    listed = await (await client.get("/v1/clusters", headers=AUTH)).json()
    assert [c["profile"] for c in listed] == ["geo"]
    assert hosts.created == 1


async def test_a_create_naming_no_profile_gets_the_default_as_before(api: tuple[Client, FakeHosts]) -> None:
    client, hosts = api
    for body in ({}, {"data": b""}, {"data": b"  \n"}):
        status, cluster = await _put(client, "/v1/clusters/bob/w1", **body)
        assert status in (200, 201) and cluster["profile"] == "default"
    status, cluster = await _put(client, "/v1/clusters/carol/w1", json={"profile": "default"})
    assert (status, cluster["profile"]) == (201, "default")
    assert hosts.created == 2


async def test_an_unknown_profile_is_422_naming_the_known_ones_and_launches_nothing(
    api: tuple[Client, FakeHosts],
) -> None:
    client, hosts = api
    status, body = await _put(client, "/v1/clusters/alice/w1", json={"profile": "gpu-large"})
    assert status == 422
    assert "unknown profile 'gpu-large'" in body["error"] and "default, geo, gpu" in body["error"]
    assert hosts.created == 0 and not hosts.clusters


async def test_another_profile_than_the_live_cluster_s_is_409_and_changes_nothing(
    api: tuple[Client, FakeHosts],
) -> None:
    client, hosts = api
    _, live = await _put(client, "/v1/clusters/alice/w1", json={"profile": "geo"})
    status, body = await _put(client, "/v1/clusters/alice/w1", json={"profile": "gpu"})
    assert status == 409
    assert "'geo'" in body["error"] and "'gpu'" in body["error"] and "DELETE" in body["error"]
    assert hosts.created == 1 and hosts.clusters[live["id"]].last_heartbeat == live["last_heartbeat"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"profile": 1}',
        b'{"profile": null}',
        b'{"profile": ["geo"]}',
        b'{"profile": "geo", "image": "registry.example.com/evil:1.0"}',
        b'{"worker_image": "registry.example.com/evil:1.0"}',
        b"{}",
        b'"geo"',
        b"geo",
        b"\xff\xfe",
    ],
)
async def test_a_body_that_is_not_just_a_profile_name_is_400(
    api: tuple[Client, FakeHosts], raw: bytes
) -> None:
    """A user names a profile the operator set; it never passes an image or a type of its own."""
    client, hosts = api
    status, body = await _put(client, "/v1/clusters/alice/w1", data=raw)
    assert status == 400 and 'no body, or {"profile": "<name>"}' in body["error"]
    assert hosts.created == 0
