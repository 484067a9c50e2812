"""Usage accounting's rules and its redis ledger (a real redis-server): per-second billing with the
minute's minimum, end times from EC2's reasons, readings counted once however often repeated, hours
selected by since/until, and the metrics' wallet labels capped with the rest under `_other`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from swarm_autoscaler.keeper.adapters.redis_usage import RedisUsage
from swarm_autoscaler.keeper.metrics import KeeperMetrics
from swarm_autoscaler.keeper.usage import (
    Machine,
    Reading,
    UsageAccountant,
    ended_at,
    readings,
    unpriced,
    usage_json,
)
from swarm_autoscaler_lab.localcloud.redis_server import RedisServer

T0 = 1_800_000_000.0  # an hour's start
PRICES = {"m5.large": 0.096}  # what the keeper's start read (set by a test: no price is AWS's here)


def machine(
    iid: str = "i-1", *, user: str = "alice", wallet: str = "w1", ended: float | None = None
) -> Machine:
    return Machine(iid, user, wallet, "kc-1", "m5.large", T0, ended)


def test_billing_is_per_second_with_a_minute_minimum() -> None:
    assert machine().billed_seconds(T0 - 5) == 0.0
    assert machine().billed_seconds(T0 + 10) == 60.0
    assert machine().billed_seconds(T0 + 90.5) == 90.5
    assert machine(ended=T0 + 100).billed_seconds(T0 + 500) == 100.0
    assert machine().price_per_second_at(PRICES) == pytest.approx(0.096 / 3600)
    spot = Machine("i-2", "a", "w", "kc-1", "m5.large", T0, spot_price_per_hour=0.036)
    assert spot.price_per_second == pytest.approx(0.01 / 1000)


def test_the_ledger_bills_the_price_the_keeper_read_at_start_and_the_spot_price_first() -> None:
    """`prices` is what the keeper's start read (the operator's price_per_hour, else the Price List):
    the one source of on-demand prices, for types the bundled catalogue lacks too."""
    prices = {"m5.large": 0.2, "m7i.large": 0.1008}
    m7i = Machine("i-3", "alice", "w1", "kc-1", "m7i.large", T0)
    spot = Machine("i-2", "alice", "w1", "kc-1", "m5.large", T0, spot_price_per_hour=0.036)
    got = {
        r.machine.instance_id: r.price_per_second for r in readings([machine(), m7i, spot], T0 + 60, prices)
    }
    assert got == pytest.approx({"i-1": 0.2 / 3600, "i-3": 0.1008 / 3600, "i-2": 0.036 / 3600})


async def test_a_machine_of_unknown_price_is_billed_neither_at_a_guess_nor_at_zero(
    ledger: RedisUsage,
) -> None:
    """A type the keeper did not price at start (no longer configured; the bundled catalogue has a
    figure for m5.large, which must not be used): not read, then all its seconds once a price is known."""
    m = machine()
    assert readings([m], T0 + 600, {}) == [] and unpriced([m], {}) == {"m5.large"}
    assert await ledger.record(readings([m], T0 + 600, {}), T0 + 600) == []
    (later,) = await ledger.record(readings([m], T0 + 900, {"m5.large": 0.2}), T0 + 900)
    assert later.seconds == 900.0 and later.price_per_second == pytest.approx(0.2 / 3600)


class Listed:
    """Stands in for EC2's listing of the keeper's machines (`Ec2Primaries.machines`)."""

    def __init__(self, machines: list[Machine]) -> None:
        self.list = machines

    async def machines(self) -> list[Machine]:
        return self.list


async def test_the_accountant_says_once_which_type_it_cannot_bill(ledger: RedisUsage) -> None:
    """A machine of a type the keeper did not price at start: one warning naming the type, however many
    passes, and the priced machines beside it are billed as usual."""
    unknown = Machine("i-9", "alice", "w1", "kc-1", "r7i.large", T0)
    accountant = UsageAccountant(Listed([machine(), unknown]), ledger, clock=lambda: T0 + 120, prices=PRICES)
    with capture_logs() as logs:
        first = await accountant.account()
        await accountant.account()
    assert [r.machine.instance_id for r in first] == ["i-1"]
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "r7i.large" in warnings[0] and "not billed yet" in warnings[0]


def test_end_time_from_the_state_transition_reason() -> None:
    raw = {
        "State": {"Name": "terminated"},
        "StateTransitionReason": "User initiated (2027-01-15 08:00:00 GMT)",
    }
    assert ended_at(raw) == datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    assert ended_at({"State": {"Name": "running"}, "StateTransitionReason": ""}) is None
    assert ended_at({"State": {"Name": "terminated"}, "StateTransitionReason": "no time"}) is None
    utc = {
        "State": {"Name": "shutting-down"},
        "StateTransitionReason": "User initiated (1970-01-01 00:01:40 UTC)",
    }
    assert ended_at(utc) == 100.0


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def ledger(redis_server: RedisServer) -> AsyncIterator[RedisUsage]:
    usage = RedisUsage(redis_server.url, f"usage-{uuid.uuid4().hex[:12]}")  # unique: an id() can repeat
    yield usage
    await usage.close()


async def test_a_repeated_or_older_reading_counts_nothing_twice(ledger: RedisUsage) -> None:
    m = machine()
    first = await ledger.record(readings([m], T0 + 30, PRICES), T0 + 30)
    assert [r.seconds for r in first] == [60.0]
    assert await ledger.record(readings([m], T0 + 30, PRICES), T0 + 30) == []  # a restart reading again
    assert (
        await ledger.record(readings([m], T0 + 20, PRICES), T0 + 20) == []
    )  # a replica with a lagging clock
    later = await ledger.record(readings([m], T0 + 100, PRICES), T0 + 100)
    assert [r.seconds for r in later] == [pytest.approx(40.0)]
    (row,) = await ledger.query("alice", "w1", None, None)
    assert row.seconds == pytest.approx(100.0)
    assert row.cost == pytest.approx(100.0 * 0.096 / 3600)


async def test_since_and_until_select_hours_and_ids_select_wallets(ledger: RedisUsage) -> None:
    a, b = machine("i-a"), machine("i-b", user="bob", wallet="w2")
    await ledger.record(readings([a, b], T0 + 600, PRICES), T0 + 600)
    await ledger.record(readings([a], T0 + 3600 + 60, PRICES), T0 + 3600 + 60)  # counted in the next hour
    assert [r.seconds for r in await ledger.query("alice", None, None, T0 + 3600)] == [600.0]
    assert [r.seconds for r in await ledger.query("alice", None, T0 + 3600, None)] == [pytest.approx(3060.0)]
    assert [r.user_id for r in await ledger.query(None, "w2", None, None)] == ["bob"]
    view = usage_json(await ledger.query(None, None, None, None))
    assert view["instance_seconds"] == pytest.approx(4260.0)
    assert [(w["user_id"], w["instance_seconds"]) for w in view["wallets"]] == [
        ("alice", 3660.0),
        ("bob", 600.0),
    ]


def test_wallet_labels_are_capped_and_the_rest_fold_into_other() -> None:
    metrics = KeeperMetrics(wallet_limit=2)
    metrics.counted([Reading(machine(f"i-{n}", wallet=f"w{n}"), 10.0, 0.001) for n in range(5)])
    text = metrics.registry.get_sample_value
    assert text("keeper_usage_instance_seconds_total", {"user": "alice", "wallet": "w0"}) == 10.0
    assert text("keeper_usage_instance_seconds_total", {"user": "alice", "wallet": "w2"}) is None
    assert text("keeper_usage_instance_seconds_total", {"user": "_other", "wallet": "_other"}) == 30.0
    assert text("keeper_usage_cost_usd_total", {"user": "_other", "wallet": "_other"}) == pytest.approx(0.03)
