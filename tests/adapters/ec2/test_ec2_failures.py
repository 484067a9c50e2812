"""Ec2Cloud under failure, against moto with injected faults: capacity refusals and their back-off,
retries on throttling and 5xx only, endpoint and credential failures."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from tests.adapters.ec2.ec2_helpers import SECRET_KEY, CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2_support import render_user_data
from swarm_autoscaler.core.backoff import CapacityBackoff
from swarm_autoscaler.core.model import Unavailable
from swarm_autoscaler.errors import EndpointError
from swarm_autoscaler_lab.localcloud import FaultInjector, LocalNetwork


async def test_capacity_refusal_moves_to_the_next_subnet(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    first, second = network.subnet_ids[:2]
    faults.refuse("m5.large", subnet_id=first)
    cloud = await make_cloud(capacity_backoff_initial=30.0, spread_subnets=False)  # in order

    result = await cloud.launch("m5.large", 2, {})

    assert result.error is None
    assert [i.subnet_id for i in result.instances] == [second, second]
    assert result.refused == (Unavailable("m5.large", clock.now + 30.0, first),)
    assert cloud.unavailable(clock.now) == result.refused
    assert cloud.stats.capacity_refusals == 1 and faults.capacity_refusals == 1
    assert cloud.stats.launch_calls == 2
    assert cloud.stats.api_calls["RunInstances"] == 2  # the refusal (HTTP 500) was not retried in place

    again = await cloud.launch("m5.large", 1, {})  # the blocked subnet is skipped without a call

    assert again.instances[0].subnet_id == second and again.refused == ()
    assert cloud.stats.launch_calls == 3


async def test_refused_type_backs_off_doubling_up_to_the_maximum(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    faults.refuse("c5.large")  # in every subnet
    cloud = await make_cloud(capacity_backoff_initial=30.0, capacity_backoff_max=600.0)
    delays = []
    for _ in range(7):
        result = await cloud.launch("c5.large", 1, {})
        assert result.instances == () and result.error is None
        assert {u.subnet_id for u in result.refused} == set(network.subnet_ids)
        delays.append({u.until - clock.now for u in result.refused})
        assert {u.subnet_id for u in cloud.unavailable(clock.now)} == set(network.subnet_ids)
        assert cloud.unavailable(max(u.until for u in result.refused)) == ()
        clock.step(max(u.until for u in result.refused) - clock.now)

    assert delays == [{30.0}, {60.0}, {120.0}, {240.0}, {480.0}, {600.0}, {600.0}]
    assert cloud.stats.capacity_refusals == 7 * len(network.subnet_ids)


async def test_blocked_type_is_not_asked_again_until_the_back_off_ends(
    make_cloud: CloudFactory, faults: FaultInjector, clock: SteppedClock
) -> None:
    faults.refuse("c5.large")
    cloud = await make_cloud(capacity_backoff_initial=30.0)
    refused = (await cloud.launch("c5.large", 1, {})).refused
    calls = cloud.stats.launch_calls

    clock.step(29.0)
    blocked = await cloud.launch("c5.large", 1, {})

    assert blocked.instances == () and set(blocked.refused) == set(refused)  # reported, not re-asked
    assert cloud.stats.launch_calls == calls


async def test_success_resets_the_back_off(
    make_cloud: CloudFactory, network: LocalNetwork, faults: FaultInjector, clock: SteppedClock
) -> None:
    first = network.subnet_ids[0]
    cloud = await make_cloud(subnet_ids=[first], capacity_backoff_initial=30.0)
    faults.refuse("t3.micro")
    await cloud.launch("t3.micro", 1, {})
    clock.step(30.0)
    assert (await cloud.launch("t3.micro", 1, {})).refused[0].until == clock.now + 60.0

    faults.allow("t3.micro")
    clock.step(60.0)
    assert len((await cloud.launch("t3.micro", 1, {})).instances) == 1
    assert cloud.unavailable(clock.now) == ()

    faults.refuse("t3.micro")
    assert (await cloud.launch("t3.micro", 1, {})).refused[0].until == clock.now + 30.0


async def test_retries_throttled_and_transient_calls(make_cloud: CloudFactory, faults: FaultInjector) -> None:
    cloud = await make_cloud()
    tokens: list[str] = []  # the ClientToken of every RunInstances request sent (watched, not changed)

    def record_token(params: dict[str, Any], **_: Any) -> None:
        tokens.append(params["body"]["ClientToken"])

    cloud._client.meta.events.register("before-call.ec2.RunInstances", record_token)
    faults.throttle("RunInstances", times=2)
    faults.throttle("DescribeInstances", times=1)
    faults.fail("DescribeInstances", times=1, status=503, code="Unavailable")

    launched = await cloud.launch("t3.micro", 1, {})
    listed = await cloud.list_instances()

    assert len(launched.instances) == 1 and launched.error is None
    assert [i.id for i in listed] == [launched.instances[0].id]  # the retried launch ran once
    assert cloud.stats.api_calls["RunInstances"] == 3
    assert cloud.stats.api_calls["DescribeInstances"] == 3
    assert cloud.stats.launch_calls == 1
    assert faults.calls()["RunInstances"] == 3
    # every retry repeats the first attempt's ClientToken, so EC2 can never start the machines twice
    assert len(tokens) == 3 and len(set(tokens)) == 1
    await cloud.launch("t3.micro", 1, {})
    assert len(tokens) == 4 and tokens[3] != tokens[0]  # a new launch is a new request


async def test_a_garbled_answer_is_retried_and_one_that_stays_garbled_is_not_ec2(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    cloud = await make_cloud(retry_attempts=3)
    faults.garble("DescribeInstances", times=2)  # a loaded endpoint's cut-short bodies, mid-run

    assert await cloud.list_instances() == ()
    assert cloud.stats.api_calls["DescribeInstances"] == 3

    faults.garble("DescribeInstances", times=10)  # some other server: the same every time
    with pytest.raises(EndpointError, match="not the EC2 API's"):
        await cloud.list_instances()
    assert cloud.stats.api_calls["DescribeInstances"] == 6  # three more attempts, then the one line


async def test_client_errors_are_not_retried(make_cloud: CloudFactory, faults: FaultInjector) -> None:
    cloud = await make_cloud()
    faults.fail("DescribeInstances", status=400, code="InvalidParameterValue", message="bad filter")

    with pytest.raises(EndpointError, match="InvalidParameterValue") as raised:
        await cloud.list_instances()

    assert raised.value.endpoint == cloud.endpoint
    assert cloud.stats.api_calls["DescribeInstances"] == 1


async def test_throttling_that_never_ends_becomes_an_endpoint_error(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    cloud = await make_cloud(retry_attempts=3)
    faults.throttle("DescribeInstances", times=10)

    with pytest.raises(EndpointError, match="RequestLimitExceeded"):
        await cloud.list_instances()

    assert cloud.stats.api_calls["DescribeInstances"] == 3


async def test_rejected_credentials_are_an_endpoint_error_without_the_secret(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    cloud = await make_cloud()
    faults.fail("DescribeInstances", status=401, code="AuthFailure", message="not authorised")
    faults.fail("RunInstances", status=401, code="AuthFailure", message="not authorised")

    with pytest.raises(EndpointError, match="credentials rejected") as listing:
        await cloud.list_instances()
    with pytest.raises(EndpointError, match="credentials rejected") as launching:
        await cloud.launch("t3.micro", 1, {})

    for raised in (listing, launching):
        assert cloud.endpoint in str(raised.value) and SECRET_KEY not in str(raised.value)
    assert cloud.stats.api_calls["DescribeInstances"] == 1


async def test_unreachable_endpoint_is_an_endpoint_error(make_cloud: CloudFactory) -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    cloud = await make_cloud(endpoint=endpoint, retry_attempts=2)

    with pytest.raises(EndpointError, match="cannot reach EC2") as raised:
        await cloud.terminate(["i-0123456789abcdef0"])

    assert raised.value.endpoint == endpoint and SECRET_KEY not in str(raised.value)
    assert cloud.stats.api_calls["DescribeInstances"] == 2  # retried once, then gave up


# ------------------------------------------------------------------------------------------ pure parts


def test_back_off_doubles_per_pair_and_forgets_on_success() -> None:
    backoff = CapacityBackoff(initial=10.0, maximum=35.0)

    assert backoff.refused("m5.large", "s1", 0.0).until == 10.0
    assert backoff.refused("m5.large", "s1", 10.0).until == 30.0
    assert backoff.refused("m5.large", "s1", 30.0).until == 65.0  # capped at 35 s
    assert backoff.refused("m5.large", "s2", 30.0).until == 40.0  # another subnet has its own count
    assert backoff.blocked("m5.large", "s1", 64.0) and not backoff.blocked("m5.large", "s1", 65.0)
    assert [u.subnet_id for u in backoff.unavailable(50.0)] == ["s1"]

    backoff.succeeded("m5.large", "s1")
    assert backoff.refused("m5.large", "s1", 100.0).until == 110.0


def test_user_data_keeps_a_given_shebang_and_quotes_the_join() -> None:
    script = render_user_data("#!/bin/sh\necho hi\n", "tok en;rm", "10.0.0.1:2377")

    assert script.startswith("#!/bin/sh\n") and "#!/bin/bash" not in script
    assert "\necho hi\n" in script
    assert "\n    docker swarm join --token 'tok en;rm' 10.0.0.1:2377\n" in script
    assert render_user_data("", "t", "m:1").startswith("#!/bin/bash\n")
