"""The keeper's lifecycle rules, one case each: `decide` is pure."""

from __future__ import annotations

from swarm_autoscaler.keeper.lifecycle import Decision, KeeperTiming, Probe, decide
from swarm_autoscaler.keeper.model import Cluster, ClusterKey, ClusterState

T = KeeperTiming(idle_timeout=300.0, max_start_time=600.0)
KEY = ClusterKey.parse("u1", "none")
T0 = 1_000_000.0


def cluster(state: ClusterState, *, beat: float = T0, answered: float | None = None) -> Cluster:
    return Cluster("kc-1", KEY, state, T0, beat, answered, scheduler_url="tcp://p:8786")


def test_a_starting_cluster_runs_once_its_scheduler_answers() -> None:
    d = decide(cluster(ClusterState.STARTING), Probe(answered=True), T0 + 50, T)
    assert d == Decision(ClusterState.RUNNING, heartbeat=T0 + 50, answered=T0 + 50)


def test_a_starting_cluster_waits_within_its_start_time() -> None:
    assert decide(cluster(ClusterState.STARTING), Probe(answered=False), T0 + 599, T) == Decision()


def test_a_primary_not_running_within_its_start_time_fails_and_is_terminated() -> None:
    d = decide(cluster(ClusterState.STARTING), Probe(answered=False), T0 + 600, T)
    assert d.state == ClusterState.FAILED and d.terminate
    assert "did not answer within 600s" in d.reason


def test_work_in_the_scheduler_is_a_heartbeat_even_when_stored_heartbeats_are_stale() -> None:
    # A keeper restarted with heartbeats an hour old: its scheduler has work, so it is kept.
    d = decide(cluster(ClusterState.RUNNING, beat=T0 - 3600), Probe(answered=True, busy=True), T0, T)
    assert d == Decision(heartbeat=T0, answered=T0)
    assert not d.terminate


def test_unused_for_the_idle_timeout_ends() -> None:
    d = decide(cluster(ClusterState.RUNNING), Probe(answered=True), T0 + 300, T)
    assert d.state == ClusterState.ENDING and d.terminate and "unused for 300s" in d.reason


def test_recently_used_is_kept() -> None:
    d = decide(cluster(ClusterState.RUNNING), Probe(answered=True), T0 + 299, T)
    assert d == Decision(answered=T0 + 299)


def test_a_scheduler_that_stopped_answering_ends_after_the_idle_timeout() -> None:
    running = cluster(ClusterState.RUNNING, beat=T0 + 1000, answered=T0 + 100)
    assert decide(running, Probe(answered=False), T0 + 399, T) == Decision()
    d = decide(running, Probe(answered=False), T0 + 400, T)
    assert d.state == ClusterState.ENDING and d.terminate and "has not answered for 300s" in d.reason


def test_ending_and_failed_clusters_are_terminated_until_gone() -> None:
    for state in (ClusterState.ENDING, ClusterState.FAILED):
        d = decide(cluster(state), Probe(answered=True, busy=True), T0, T)
        assert d.terminate and d.state is None


def test_the_heartbeat_lag_is_waited_for_before_an_idle_end() -> None:
    lagging = KeeperTiming(idle_timeout=300.0, max_start_time=600.0, heartbeat_lag=75.0)
    assert decide(cluster(ClusterState.RUNNING), Probe(answered=True), T0 + 374, lagging).state is None
    d = decide(cluster(ClusterState.RUNNING), Probe(answered=True), T0 + 375, lagging)
    assert d.state == ClusterState.ENDING and "unused for 375s (idle timeout 300s)" in d.reason


def test_silence_counts_from_no_earlier_than_when_the_replica_began_to_hold_the_cluster() -> None:
    # The stored answer time is old (not rewritten while it answered); this replica took over at T0 + 900.
    running = cluster(ClusterState.RUNNING, beat=T0 + 1000, answered=T0 + 100)
    assert decide(running, Probe(answered=False), T0 + 1199, T, held_since=T0 + 900) == Decision()
    d = decide(running, Probe(answered=False), T0 + 1200, T, held_since=T0 + 900)
    assert d.state == ClusterState.ENDING and "has not answered for 300s" in d.reason


NC = KeeperTiming(idle_timeout=300.0, max_start_time=600.0, no_client_timeout=120.0)


def test_no_client_and_no_work_for_the_no_client_timeout_ends() -> None:
    running = cluster(ClusterState.RUNNING)
    kept = decide(running, Probe(answered=True, clients=0), T0 + 119, NC, present_since=T0)
    assert kept == Decision(answered=T0 + 119)
    d = decide(running, Probe(answered=True, clients=0), T0 + 120, NC, present_since=T0)
    assert d.state == ClusterState.ENDING and d.terminate
    assert d.reason == "no client and no work for 120s (no-client timeout 120s)"


def test_a_client_an_unknown_count_or_a_short_watch_keeps_the_cluster() -> None:
    running = cluster(ClusterState.RUNNING)
    late = T0 + 250  # within the idle timeout, past the no-client one
    assert not decide(running, Probe(answered=True, clients=1), late, NC, present_since=T0).terminate
    assert not decide(running, Probe(answered=True, clients=None), late, NC, present_since=T0).terminate
    # a replica that took the cluster over 60 s ago has not watched it for the whole timeout
    assert not decide(
        running, Probe(answered=True, clients=0), late, NC, held_since=late - 60, present_since=T0
    ).terminate
    # off: 0
    off = KeeperTiming(idle_timeout=3000.0, no_client_timeout=0.0)
    assert not decide(running, Probe(answered=True, clients=0), late, off, present_since=T0).terminate


def test_the_heartbeat_idle_timeout_still_applies_with_clients() -> None:
    d = decide(
        cluster(ClusterState.RUNNING), Probe(answered=True, clients=2), T0 + 300, NC, present_since=T0 + 299
    )
    assert d.state == ClusterState.ENDING and "unused for 300s" in d.reason


def test_a_wallet_over_budget_ends_its_cluster_only_once_the_grace_is_over() -> None:
    busy = Probe(answered=True, busy=True, clients=1)
    kept = decide(cluster(ClusterState.RUNNING), busy, T0 + 599, T, budget_ends_at=T0 + 600)
    assert not kept.terminate  # busy or not, until the grace ends
    d = decide(cluster(ClusterState.RUNNING), busy, T0 + 600, T, budget_ends_at=T0 + 600)
    assert d.state == ClusterState.ENDING and d.terminate
    assert d.reason == "its wallet none spent its budget; ended after the 600s grace"
    assert decide(cluster(ClusterState.STARTING), None, T0 + 700, T, budget_ends_at=T0 + 600).terminate
