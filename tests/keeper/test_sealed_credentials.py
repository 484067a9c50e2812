"""The clusters' private keys sealed at rest in a real redis-server: a dump of redis (what an attacker who
reads redis, or a backup of it, gets) holds no private key, no PEM and nothing that opens with another
key; a sealed value moved under another cluster's key does not open; replicas with the same key agree; a
plaintext set left by a keeper that ran without the key is sealed in place; and a keeper with the wrong
key or none refuses to read sealed ones, naming the setting."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import pytest
import redis

from swarm_autoscaler.errors import ConfigurationError
from swarm_autoscaler.keeper.adapters.redis_credentials import CredentialsUnreadableError, RedisCredentials
from swarm_autoscaler.keeper.adapters.sealing import Sealer, SealError, key_from_text
from swarm_autoscaler.keeper.adapters.tls import make_credentials
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password="pw-of-the-sealing-test") as server:
        yield server


def a_key() -> bytes:
    return os.urandom(32)


def dump(server: RedisServer) -> bytes:
    client = redis.Redis.from_url(server.url)
    try:
        return b"\n".join(client.get(k) or b"" for k in client.keys("*credentials:*"))
    finally:
        client.close()


async def test_a_dump_of_redis_holds_no_private_key_and_replicas_with_the_key_agree(
    redis_server: RedisServer,
) -> None:
    key = a_key()
    a = RedisCredentials(redis_server.url, "seal-a", make_credentials, sealer=Sealer(key))
    b = RedisCredentials(redis_server.url, "seal-a", make_credentials, sealer=Sealer(key))
    try:
        made = await a.get_or_make("kc-1")
        assert await b.get("kc-1") == made == await b.get_or_make("kc-1")
        stolen = dump(redis_server)
        assert stolen.startswith(b"sa1:")
        assert b"PRIVATE KEY" not in stolen and b"BEGIN" not in stolen
        assert made.ca_key.encode() not in stolen
    finally:
        await a.close()
        await b.close()


async def test_another_key_none_or_a_moved_value_does_not_open(redis_server: RedisServer) -> None:
    key = a_key()
    mine = RedisCredentials(redis_server.url, "seal-b", make_credentials, sealer=Sealer(key))
    wrong = RedisCredentials(redis_server.url, "seal-b", make_credentials, sealer=Sealer(a_key()))
    none = RedisCredentials(redis_server.url, "seal-b", make_credentials)
    try:
        await mine.get_or_make("kc-1")
        with pytest.raises(CredentialsUnreadableError, match="AUTOSCALER_KEEPER_SECRETS_KEY"):
            await wrong.get("kc-1")
        with pytest.raises(CredentialsUnreadableError, match="sealed"):
            await none.get("kc-1")
        client = redis.Redis.from_url(redis_server.url)
        client.set(
            "swarm-autoscaler:keeper:seal-b:credentials:kc-2",
            client.get("swarm-autoscaler:keeper:seal-b:credentials:kc-1") or b"",
        )
        client.close()
        with pytest.raises(CredentialsUnreadableError):  # bound to its key name: kc-1's set is not kc-2's
            await mine.get("kc-2")
    finally:
        for store in (mine, wrong, none):
            await store.close()


async def test_a_plaintext_set_left_without_the_key_is_sealed_in_place(redis_server: RedisServer) -> None:
    before = RedisCredentials(redis_server.url, "seal-c", make_credentials)
    after = RedisCredentials(redis_server.url, "seal-c", make_credentials, sealer=Sealer(a_key()))
    try:
        made = await before.get_or_make("kc-1")
        assert b"PRIVATE KEY" in dump(redis_server)  # what the keeper stored before this change
        assert await after.get("kc-1") == made
        assert b"PRIVATE KEY" not in dump(redis_server)
    finally:
        await before.close()
        await after.close()


def test_the_key_setting_is_checked() -> None:
    good = base64.b64encode(a_key()).decode()
    assert len(key_from_text(good + "\n")) == 32  # a file from `docker secret create` may end in a newline
    for bad in ("", "short", base64.b64encode(b"x" * 16).decode(), "not base64 at all!!"):
        with pytest.raises(ConfigurationError, match="AUTOSCALER_KEEPER_SECRETS_KEY"):
            key_from_text(bad)
    sealer = Sealer(a_key())
    with pytest.raises(SealError):
        sealer.open("k", "plain text")
    with pytest.raises(SealError):
        sealer.open("k", "sa1:" + base64.b64encode(b"\0" * 40).decode())
