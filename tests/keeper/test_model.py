"""Cluster ids: what is accepted, what is refused (422 in the API), and the creation lock's name."""

from __future__ import annotations

import pytest

from swarm_autoscaler.keeper.model import ClusterKey, InvalidIdError


@pytest.mark.parametrize("value", ["u", "42", "user_1", "a-b", "none", "x" * 64])
def test_valid_ids(value: str) -> None:
    assert ClusterKey.parse(value, value).user_id == value


@pytest.mark.parametrize("value", ["", "-a", "_a", "a b", "a/b", "a:b", "é", "x" * 65, "a\n"])
def test_invalid_ids_name_the_rule(value: str) -> None:
    with pytest.raises(InvalidIdError, match=r"user_id .* is not valid: 1 to 64 characters"):
        ClusterKey.parse(value, "none")


def test_the_creation_lock_is_per_pair() -> None:
    assert ClusterKey.parse("u", "w").lock_name != ClusterKey.parse("u", "none").lock_name
