"""`AUTOSCALER_EC2_JOIN_URL=auto`: a launch's user data names every manager's address, as the swarm port
gives it to workers, at the daemon's join port (TLS), read at each launch; it carries a join ticket and no
join token. With no manager address to name, nothing is launched and the launch says why.

Stands in for: EC2, moto over HTTP, each RunInstances captured as it leaves the process (botocore's
before-send) and its user data decoded once as EC2 does; swarm, the project's in-memory swarm
(`MemorySwarm`, our own Orchestrator port's fake) with the managers each test gives it.
"""

from __future__ import annotations

import re

from tests.adapters.ec2.ec2_helpers import CloudFactory, tags_in, wire

from swarm_autoscaler.adapters.ec2_join import JoinUrls, auto_join_urls
from swarm_autoscaler.adapters.join_tickets import JOIN_NONCE_TAG
from swarm_autoscaler.adapters.join_tls import join_pin
from swarm_autoscaler_lab.localcloud import FaultInjector
from swarm_autoscaler_lab.localcloud.memswarm import MemorySwarm
from swarm_autoscaler_lab.localcloud.moto_user_data import as_ec2_decodes

TOKEN = "SWMTKN-1-auto-test-token-0123456789"
TICKET_IN = re.compile(r'"ticket": "([0-9a-f]{64})"')
MANAGERS = ("10.0.1.5:2377", "10.0.2.5:2377", "[fd00::7]:2377")  # leader first, as the adapter orders them


async def test_auto_names_every_manager_at_the_join_port_with_a_ticket_a_pin_and_no_token(
    make_cloud: CloudFactory,
) -> None:
    swarm = MemorySwarm(TOKEN, MANAGERS[0], managers=MANAGERS)
    cloud = await make_cloud(
        join_command=swarm.join_command, join_urls=JoinUrls(managers=swarm.manager_addresses, port=8443)
    )
    sent = wire(cloud, "RunInstances")
    result = await cloud.launch("m5.large", 2, {})
    assert len(result.instances) == 2, result.error
    assert sent  # one RunInstances per subnet the launch is spread over
    urls = [
        "https://10.0.1.5:8443/v1/join",
        "https://10.0.2.5:8443/v1/join",
        "https://[fd00::7]:8443/v1/join",
    ]
    for params in sent:
        user_data = as_ec2_decodes(params["UserData"])
        at = [user_data.find(url) for url in urls]
        assert -1 not in at and at == sorted(at), user_data  # each manager, tried leader first
        assert TICKET_IN.search(user_data) is not None
        assert f"--pinnedpubkey sha256//{join_pin(TOKEN)} " in user_data  # the join endpoint's key
        assert TOKEN not in user_data and "SWMTKN" not in user_data
        assert all(TOKEN not in value for value in params.values())  # nor in tags or any other parameter
        assert re.fullmatch(
            r"[0-9a-f]{32}", tags_in(params, "instance")[JOIN_NONCE_TAG]
        )  # the ticket's nonce


async def test_auto_reads_the_managers_again_at_each_launch(make_cloud: CloudFactory) -> None:
    """Managers come and go (promoted, demoted, replaced): the next launch names the managers then."""
    swarm = MemorySwarm(TOKEN, MANAGERS[0], managers=MANAGERS[:1])
    cloud = await make_cloud(
        join_command=swarm.join_command, join_urls=JoinUrls(managers=swarm.manager_addresses, port=8123)
    )
    sent = wire(cloud, "RunInstances")
    assert (await cloud.launch("m5.large", 1, {})).instances
    swarm.managers = ("10.0.3.9:2377",)
    assert (await cloud.launch("m5.large", 1, {})).instances
    first, second = (as_ec2_decodes(p["UserData"]) for p in sent)
    assert "https://10.0.1.5:8123/v1/join" in first and "10.0.3.9" not in first
    assert "https://10.0.3.9:8123/v1/join" in second and "10.0.1.5" not in second


async def test_auto_with_no_manager_address_launches_nothing_and_says_why(
    make_cloud: CloudFactory, faults: FaultInjector
) -> None:
    swarm = MemorySwarm(TOKEN, "0.0.0.0:2377", managers=("0.0.0.0:2377",))
    cloud = await make_cloud(
        join_command=swarm.join_command, join_urls=JoinUrls(managers=swarm.manager_addresses, port=8443)
    )
    faults.record()
    result = await cloud.launch("m5.large", 1, {})
    assert not result.instances
    assert result.error is not None and "AUTOSCALER_EC2_JOIN_URL=auto" in result.error
    assert not [c for c in faults.recorded() if c.action == "RunInstances"]


def test_auto_join_urls_keep_ipv6_brackets_and_drop_duplicates_and_unspecified_hosts() -> None:
    managers = ["10.0.0.5:2377", "10.0.0.5:2377", "[fd00::1]:2377", "0.0.0.0:2377", "[::]:2377", ""]
    assert auto_join_urls(managers, 9000) == (
        "https://10.0.0.5:9000/v1/join",
        "https://[fd00::1]:9000/v1/join",
    )
