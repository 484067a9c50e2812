"""EC2's clock as the daemon's only clock: `Ec2Clock` on its own (stepped host clocks), then `Ec2Cloud`
over the moto server whose clock the fault injector skews against this host's."""

from __future__ import annotations

import email.utils
import time

import pytest
from tests.adapters.ec2.ec2_helpers import CloudFactory
from tests.fakes import SteppedClock

from swarm_autoscaler.adapters.ec2_clock import Ec2Clock, parse_http_date
from swarm_autoscaler_lab.localcloud import FaultInjector

EC2_NOW = 1_800_000_000.0  # EC2's time when the first response arrives in these tests
SKEWS = (-3600.0, -600.0, 600.0, 3600.0)  # host clock minus EC2's clock


def date(epoch: float) -> str:
    return email.utils.formatdate(epoch, usegmt=True)


def clocks(skew: float) -> tuple[SteppedClock, SteppedClock, Ec2Clock]:
    """(host wall clock `skew` ahead of EC2, host monotonic clock, the EC2 clock on them)."""
    wall, mono = SteppedClock(EC2_NOW + skew), SteppedClock(50.0)
    return wall, mono, Ec2Clock(wall=wall, monotonic=mono)


def test_parse_http_date() -> None:
    assert parse_http_date("Mon, 30 Nov 2026 08:01:13 GMT") == 1796025673.0
    for bad in (None, "", "yesterday", "Mon, 30 Nov 2026 08:01:13 -0000"):
        assert parse_http_date(bad) is None


def answer(clock: Ec2Clock, mono: SteppedClock, ec2_at_stamp: float, rtt: float = 0.1) -> None:
    """An answer to a request that leaves now and is received `rtt` seconds later, stamped by EC2 at
    `ec2_at_stamp` (some time in between; its Date floors it)."""
    sent = mono()
    mono.step(rtt)
    clock.observe(date(int(ec2_at_stamp)), sent, mono())


def test_falls_back_to_the_host_clock_until_ec2_answers() -> None:
    wall, mono, clock = clocks(600.0)
    assert not clock.synced and clock.offset() is None and clock.uncertainty() is None
    assert clock.now() == wall()
    clock.observe(None, mono(), mono())  # an answer without a Date header teaches nothing
    clock.observe("garbage", mono(), mono())
    assert not clock.synced and clock.samples == 0


@pytest.mark.parametrize("skew", SKEWS)
def test_follows_ec2_whatever_the_host_clock_says_or_does(skew: float) -> None:
    wall, mono, clock = clocks(skew)
    answer(clock, mono, EC2_NOW + 0.3, rtt=0.1)  # stamped as the request left: EC2_NOW + 0.4 on arrival
    assert clock.synced
    uncertainty = clock.uncertainty()
    assert uncertainty is not None and uncertainty <= 0.55  # (1 s + rtt) / 2
    assert clock.now() == pytest.approx(EC2_NOW + 0.4, abs=uncertainty)
    assert clock.offset() == pytest.approx(-skew, abs=1.0)
    mono.step(42.0)
    wall.step(42.0)
    assert clock.now() == pytest.approx(EC2_NOW + 42.4, abs=uncertainty)
    before = clock.now()
    wall.step(-2 * skew)  # the host's wall clock steps (NTP, an operator): EC2's time does not move
    assert clock.now() == before


def test_quick_answers_narrow_the_bounds_and_slow_ones_do_not_widen_them() -> None:
    _, mono, clock = clocks(0.0)
    truth = EC2_NOW + 0.7  # EC2's time when the first request leaves; EC2 runs with the monotonic clock
    start = mono()

    def ec2() -> float:
        return truth + mono() - start

    for _ in range(12):  # quick answers at various phases of EC2's second
        answer(clock, mono, ec2() + 0.02, rtt=0.04)
        mono.step(0.37)
    narrow = clock.uncertainty()
    assert narrow is not None and narrow < 0.2
    assert clock.now() == pytest.approx(ec2(), abs=narrow)
    answer(clock, mono, ec2() + 0.1, rtt=5.0)  # a slow answer: loose bounds, consistent, nothing changes
    assert clock.uncertainty() == narrow and clock.restarts == 1
    assert clock.now() == pytest.approx(ec2(), abs=narrow)


def test_an_answer_that_contradicts_the_bounds_restarts_them() -> None:
    _, mono, clock = clocks(0.0)
    answer(clock, mono, EC2_NOW)
    answer(clock, mono, EC2_NOW + 60)  # EC2's clock stepped a minute ahead
    assert clock.restarts == 2
    assert clock.now() == pytest.approx(EC2_NOW + 60.5, abs=0.6)
    answer(clock, mono, EC2_NOW + 50)  # and back
    assert clock.restarts == 3
    assert clock.now() == pytest.approx(EC2_NOW + 50.5, abs=0.6)


@pytest.mark.parametrize("skew", (0.0, *SKEWS))
async def test_the_cloud_reads_ec2s_clock_not_the_hosts(
    make_cloud: CloudFactory, faults: FaultInjector, skew: float
) -> None:
    """EC2 `skew` seconds off this host: `now()` and LaunchTime agree with each other, not with the host."""
    faults.skew_clock(skew)
    cloud = await make_cloud(clock=None)
    assert not cloud.ec2_clock.synced
    await cloud.list_instances()
    assert cloud.ec2_clock.synced
    assert cloud.now() == pytest.approx(time.time() + skew, abs=2.0)
    offset = cloud.ec2_clock.offset()
    assert offset is not None and offset == pytest.approx(skew, abs=2.0)
    launched = (await cloud.launch("t3.micro", 1, {})).instances
    assert len(launched) == 1
    assert cloud.now() - launched[0].launched_at == pytest.approx(0.0, abs=2.0)
    listed = await cloud.list_instances()
    assert [i.launched_at for i in listed] == [launched[0].launched_at]


async def test_error_answers_tell_the_time_too(make_cloud: CloudFactory, faults: FaultInjector) -> None:
    faults.skew_clock(-3600.0)
    faults.fail("DescribeInstanceTypes", 1, status=400, code="InvalidParameterValue")
    cloud = await make_cloud(clock=None)
    with pytest.raises(Exception, match="InvalidParameterValue"):
        await cloud.instance_types(["t3.micro"])
    assert cloud.ec2_clock.synced
    assert cloud.now() == pytest.approx(time.time() - 3600.0, abs=2.0)
