"""A real redis-server for the lock tests, started once per session on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

PASSWORD = "s3cret-Pa55word"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server
