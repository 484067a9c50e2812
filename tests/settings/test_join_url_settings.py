"""`AUTOSCALER_EC2_JOIN_URL`: `auto`, URLs (JSON list or comma separated) or empty, read from the
environment as the daemon reads it (`load_settings`); `auto` mixed with URLs is one problem line, and so
is an http:// URL (the join endpoint serves TLS only: the join token must not cross the VPC in clear)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from swarm_autoscaler.config.policy import policy_from_settings
from swarm_autoscaler.config.settings import InvalidSettingsError, load_settings
from swarm_autoscaler.core.model import GIB, InstanceType, Resources

SetEnv = Callable[..., None]
URLS = ["https://10.0.0.10:8443/v1/join", "https://10.0.1.10:8443/v1/join"]


@pytest.mark.parametrize(
    ("value", "urls", "auto"),
    [
        (None, [], False),  # the default: join tickets off, for deployments from before
        ("", [], False),
        ("auto", ["auto"], True),
        (" auto ", ["auto"], True),
        (",".join(URLS), URLS, False),
        ('["https://10.0.0.10:8443/v1/join", "https://10.0.1.10:8443/v1/join"]', URLS, False),
    ],
)
def test_join_url_takes_auto_a_list_or_nothing(
    set_env: SetEnv, value: str | None, urls: list[str], auto: bool
) -> None:
    set_env(AUTOSCALER_EC2_JOIN_URL=value)
    settings = load_settings()
    assert (settings.ec2.join_url, settings.ec2.join_auto) == (urls, auto)


@pytest.mark.parametrize(
    "value",
    ["auto,https://10.0.0.10:8443/v1/join", "automatic", "10.0.0.10:8443", "http://10.0.0.10:8000/v1/join"],
)
def test_auto_beside_urls_or_a_non_url_is_one_problem(set_env: SetEnv, value: str) -> None:
    set_env(AUTOSCALER_EC2_JOIN_URL=value)
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    [problem] = caught.value.problems
    assert problem.startswith("AUTOSCALER_EC2_JOIN_URL"), problem


def test_an_http_join_url_is_refused_saying_why(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_JOIN_URL="http://10.0.0.10:8000/v1/join")
    with pytest.raises(InvalidSettingsError) as caught:
        load_settings()
    [problem] = caught.value.problems
    assert "https://" in problem and "must not cross the VPC in clear" in problem, problem


def test_the_join_port_defaults_to_8443(set_env: SetEnv) -> None:
    set_env(AUTOSCALER_EC2_JOIN_PORT=None)
    assert load_settings().ec2.join_port == 8443


def test_join_tickets_turn_adoption_by_identity_on(set_env: SetEnv) -> None:
    """With join tickets, machines confirm their node on the join desk, so the planner adopts only
    confirmed nodes (`Policy.adopt_by_identity`, tests/core/test_adopt_by_identity.py); without, it
    cannot (nothing confirms), and the hostname decides as before."""
    catalogue = {"m5.large": InstanceType("m5.large", Resources.of(cpus=2, ram=8 * GIB), 0.096)}
    set_env(AUTOSCALER_EC2_ALLOWED_TYPES='{"m5.large": {"ami_id": "ami-12345678"}}')
    for value, on in ((None, False), ("auto", True), (URLS[0], True)):
        set_env(AUTOSCALER_EC2_JOIN_URL=value)
        assert policy_from_settings(load_settings(), catalogue).adopt_by_identity is on, value
