"""Grouping windows: a condition waits only as long as its siblings can take to arrive."""

from __future__ import annotations

import asyncio
import random
import sqlite3

import pytest

from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.grouping import GroupingWindows, ReportCadence, ripe_batch
from controller.detect.grouping_task import GroupingTask
from controller.detect.incidents import IncidentStore
from controller.fabric import Fabric
from starpulse.core.clock import FakeClock
from starpulse.core.vocab import EVICTABLE_KINDS
from tests.support.correlate import clock, fabric, gpu_xid, heartbeat, nic_down, opened

__all__ = ["clock", "fabric"]  # the correlator tests' fixtures, used here by name


def cadence_of(interval_s: float, nodes: int = 32) -> ReportCadence:
    cadence = ReportCadence(FakeClock().monotonic, cache_s=0)
    for n in range(nodes):
        cadence.saw(f"node-{n:03d}", 1_000)
        cadence.saw(f"node-{n:03d}", 1_000 + int(interval_s * 1000))
    return cadence


def correlator(fabric: Fabric, clock: FakeClock, interval_s: float) -> Correlator:
    return correlator_and_windows(fabric, clock, interval_s)[0]


def correlator_and_windows(fabric: Fabric, clock: FakeClock, interval_s: float) -> tuple[Correlator, GroupingWindows]:
    """A correlator on production windows (settle_s 15 s as the cap) over a fleet reporting every interval_s."""
    config = CorrelationConfig(settle_s=15.0, resolve_hold_s=60.0)
    windows = GroupingWindows(config, cadence_of(interval_s).interval_s, sweep_s=1.0)
    store = IncidentStore(sqlite3.connect(":memory:", isolation_level=None))
    return Correlator(fabric, store, config, clock=clock, window_ms=windows.window_ms), windows


class TestReportCadence:
    def test_interval_is_measured_from_report_timestamps(self) -> None:
        """Nodes reporting every 5 s measure 5 s; nothing measured before a node's second report."""
        cadence = ReportCadence(FakeClock().monotonic, cache_s=0)
        cadence.saw("node-000", 10_000)
        assert cadence.interval_s() is None
        cadence.saw("node-000", 15_000)
        assert cadence.interval_s() == 5.0

    def test_one_reconnect_gap_does_not_stretch_the_fleet_window(self) -> None:
        """A single node's 60 s gap among 99 nodes at 1 s leaves the measured interval at 1 s."""
        cadence = cadence_of(1.0, nodes=99)
        cadence.saw("node-x", 0)
        cadence.saw("node-x", 60_000)
        assert cadence.interval_s() == 1.0

    def test_a_forgotten_node_no_longer_counts(self) -> None:
        cadence = ReportCadence(FakeClock().monotonic, cache_s=0)
        cadence.saw("a", 0)
        cadence.saw("a", 9_000)
        cadence.forget("a")
        assert cadence.interval_s() is None


class TestGroupingWindows:
    @pytest.mark.parametrize(("interval_s", "nic_s", "heartbeat_s"), [(1.0, 1.25, 2.25), (5.0, 5.25, 6.25)])
    def test_windows_follow_how_siblings_are_observed(self, clock, interval_s, nic_s, heartbeat_s) -> None:
        """GPU: the short node window at any interval; NIC: the interval + slack; heartbeat: + the sweep."""
        windows = GroupingWindows(CorrelationConfig(settle_s=15.0), cadence_of(interval_s).interval_s, sweep_s=1.0)
        assert windows.window_s(gpu_xid(1, 0, clock)) == 0.05
        assert windows.window_s(nic_down(1, 3, clock)) == pytest.approx(nic_s)
        assert windows.window_s(heartbeat(1, clock)) == pytest.approx(heartbeat_s)

    def test_settle_s_caps_every_window_and_covers_an_unmeasured_fleet(self, clock) -> None:
        """Before any interval is measured a NIC waits settle_s; settle_s 0 groups everything at once."""
        assert GroupingWindows(CorrelationConfig(settle_s=3.0)).window_s(nic_down(1, 3, clock)) == 3.0
        zero = GroupingWindows(CorrelationConfig(settle_s=0.0), cadence_of(5.0).interval_s)
        assert zero.window_s(nic_down(1, 3, clock)) == 0 and zero.window_s(gpu_xid(1, 0, clock)) == 0


class TestRipeBatch:
    def test_a_ripe_nic_brings_the_nics_that_reported_after_it(self, clock) -> None:
        """The leaf's later NIC conditions are grouped with the first; a pending GPU of another node is not."""
        conds = {c.key: c for c in (nic_down(1, 3, clock), nic_down(2, 3, clock), gpu_xid(5, 0, clock))}
        keys = list(conds)
        pending = {keys[0]: 100, keys[1]: 900, keys[2]: 950}
        assert ripe_batch(pending, conds, 100) == sorted(keys[:2])

    def test_a_ripe_gpu_brings_only_its_own_node(self, clock) -> None:
        conds = {c.key: c for c in (gpu_xid(1, 0, clock), gpu_xid(1, 1, clock), gpu_xid(2, 0, clock))}
        keys = list(conds)
        pending = {keys[0]: 50, keys[1]: 80, keys[2]: 60}
        assert ripe_batch(pending, conds, 50) == sorted(keys[:2])
        assert ripe_batch(pending, conds, 49) == []


class TestWindowsInTheCorrelator:
    def test_gpu_hard_fault_opens_after_the_node_window_at_a_5s_interval(self, fabric, clock) -> None:
        """Xid 79 at a 5 s report interval: the incident opens 50 ms later, not after a settle of seconds."""
        corr = correlator(fabric, clock, 5.0)
        corr.on_changes(opened(gpu_xid(1, 2, clock)))
        clock.advance(0.04)
        assert corr.tick() == []
        clock.advance(0.01)
        ((change, inc),) = corr.tick()
        assert (change, inc.kind, inc.root_cause) == ("opened", "gpu_fault", "node-001/gpu-2")

    def test_gpus_of_one_node_failing_together_are_one_node_incident(self, fabric, clock) -> None:
        """Three GPUs of node-001 within the node window: one node_fault, no gpu_fault opened first."""
        corr = correlator(fabric, clock, 5.0)
        corr.on_changes(opened(gpu_xid(1, 0, clock)))
        clock.advance(0.02)
        corr.on_changes(opened(gpu_xid(1, 1, clock), gpu_xid(1, 2, clock)))
        clock.advance(0.03)
        out = corr.tick()
        assert [(c, i.kind, i.root_cause) for c, i in out] == [("opened", "node_fault", "node-001")]

    def test_leaf_dying_at_5s_opens_no_incident_before_its_window_then_one_switch_incident(self, fabric, clock):
        """NICs of one leaf reporting down over a 5 s interval: nothing opens (nothing to evict) for
        5.25 s, then one switch_fault that blames no node; no NIC incident opened and merged away."""
        corr = correlator(fabric, clock, 5.0)
        seen = []
        for i in range(16):  # reports spread over the interval
            corr.on_changes(opened(nic_down(i, 3, clock)))
            seen += corr.tick()
            clock.advance(0.3)
        assert seen == []  # 4.8 s in: still inside the first condition's window
        clock.advance(0.45)
        seen += corr.tick()
        assert [(c, i.kind) for c, i in seen] == [("opened", "switch_fault")]
        assert seen[0][1].kind not in EVICTABLE_KINDS

    @pytest.mark.parametrize("seen_by", ["reports", "events"])
    @pytest.mark.parametrize("interval_s", [1.0, 5.0])
    def test_a_dying_leaf_opens_no_nic_incident_to_merge_away(self, fabric, clock, interval_s, seen_by) -> None:
        """No churn, counted: a leaf's 16 NICs go down at random moments of one report interval
        (seen in reports) or of one 0.5 s link-watch poll (seen as events), grouped as the grouping
        task would (every 10 ms): one switch_fault, and not one NIC incident opened, merged or stored."""
        rng = random.Random(f"{interval_s}-{seen_by}")
        corr, windows = correlator_and_windows(fabric, clock, interval_s)
        spread_ms = int((interval_s if seen_by == "reports" else 0.5) * 1000)
        arrive = sorted((rng.randrange(spread_ms), i) for i in range(16))
        seen = []
        for t_ms in range(0, spread_ms + int(interval_s * 1000) + 1000, 10):
            while arrive and arrive[0][0] <= t_ms:
                cond = nic_down(arrive.pop(0)[1], 3, clock)
                if seen_by == "events":
                    windows.by_event.add(cond.key)
                corr.on_changes(opened(cond))
            seen += corr.tick()
            clock.advance(0.01)
        assert [(c, i.kind, i.root_cause) for c, i in seen] == [("opened", "switch_fault", "leaf-b0-r3")]
        stored = corr.store.list_incidents(active_only=False)
        assert [i.kind for i in stored] == ["switch_fault"]  # no NIC incident ever opened, so none merged
        assert corr.store.merged_into(stored[0].id) is None

    def test_two_nic_faults_minutes_apart_are_two_nic_incidents(self, fabric, clock) -> None:
        """Independent NIC faults on two nodes of one leaf, 3 minutes apart: two nic_fault, no switch."""
        corr = correlator(fabric, clock, 5.0)
        corr.on_changes(opened(nic_down(1, 3, clock)))
        clock.advance(5.25)
        first = corr.tick()
        clock.advance(180)
        corr.on_changes(opened(nic_down(2, 3, clock)))
        clock.advance(5.25)
        second = corr.tick()
        kinds = [(c, i.kind, i.root_cause) for c, i in first + second]
        assert kinds == [("opened", "nic_fault", "node-001/nic-3"), ("opened", "nic_fault", "node-002/nic-3")]


class TestGroupingTask:
    async def test_groups_when_the_window_closes_without_a_tick(self, fabric, clock) -> None:
        """Woken by a new condition, the task groups it once the clock reaches its due time."""
        corr = correlator(fabric, clock, 5.0)
        published: list[object] = []
        task = GroupingTask(corr.next_due_ms, lambda: published.extend(corr.tick()), clock)
        runner = asyncio.create_task(task.run())
        try:
            await asyncio.sleep(0)
            corr.on_changes(opened(gpu_xid(1, 2, clock)))
            task.wake()
            await clock.run_for(0.04)
            assert published == []
            await clock.run_for(0.02)
            assert len(published) == 1 and task.groupings == 1
        finally:
            runner.cancel()

    async def test_a_failing_grouping_is_retried_not_spun(self, clock) -> None:
        """A grouping that raises waits retry_s before the next try."""
        calls: list[float] = []

        def boom() -> None:
            calls.append(clock.monotonic())
            raise RuntimeError("bug")

        task = GroupingTask(lambda: 0, boom, clock, retry_s=1.0)
        runner = asyncio.create_task(task.run())
        try:
            await clock.run_for(2.5)
            assert len(calls) == 3
        finally:
            runner.cancel()


class TestEventBorneWindows:
    def test_a_nic_down_raised_by_an_event_waits_the_event_window_at_any_interval(self, clock) -> None:
        """A port-down event's condition: 0.5 s at a 5 s interval; the same condition from a report: 5.25 s."""
        windows = GroupingWindows(CorrelationConfig(settle_s=15.0), cadence_of(5.0).interval_s)
        cond = nic_down(1, 3, clock)
        windows.by_event.add(cond.key)
        assert windows.window_s(cond) == 0.5
        assert windows.window_s(cond) == pytest.approx(5.25)  # marked once: the next ask is a report's

    def test_leaf_down_by_events_is_one_switch_incident_within_the_event_window(self, fabric, clock) -> None:
        """Sixteen port-down events within 0.2 s at a 5 s interval: one switch_fault 0.5 s after the first."""
        corr, windows = correlator_and_windows(fabric, clock, 5.0)
        for i in range(16):
            cond = nic_down(i, 3, clock)
            windows.by_event.add(cond.key)
            corr.on_changes(opened(cond))
            clock.advance(0.0125)
        assert corr.tick() == []
        clock.advance(0.3)
        out = corr.tick()
        assert [(c, i.kind, i.root_cause) for c, i in out] == [("opened", "switch_fault", "leaf-b0-r3")]

    def test_two_port_down_events_seconds_apart_are_two_nic_incidents(self, fabric, clock) -> None:
        """At a 5 s report interval, two nodes of one leaf lose a port 2 s apart, each by an event:
        each waited 0.5 s, so the second is no sibling of the first (a report's 5.25 s window,
        asked again while grouping, would have merged both under the leaf)."""
        corr, windows = correlator_and_windows(fabric, clock, 5.0)
        seen = []
        for node in (1, 2):
            cond = nic_down(node, 3, clock)
            windows.by_event.add(cond.key)
            corr.on_changes(opened(cond))
            clock.advance(0.5)
            seen += corr.tick()
            clock.advance(1.5)
        seen += corr.tick()
        assert [(c, i.kind, i.root_cause) for c, i in seen] == [
            ("opened", "nic_fault", "node-001/nic-3"),
            ("opened", "nic_fault", "node-002/nic-3"),
        ]


class TestStandingApart:
    def test_a_later_condition_on_the_same_gpu_joins_its_open_incident(self, fabric, clock) -> None:
        """A DBE's event opens gpu_fault; the report's condition on that GPU 1 s later joins it: one incident."""
        corr = correlator(fabric, clock, 1.0)
        corr.on_changes(opened(gpu_xid(2, 1, clock)))
        clock.advance(0.05)
        first = corr.tick()
        clock.advance(1.0)
        later = gpu_xid(2, 1, clock)
        later.rule = "gpu.ecc_dbe"
        corr.on_changes(opened(later))
        clock.advance(0.05)
        out = first + corr.tick()
        assert [(c, i.kind, i.root_cause) for c, i in out] == [
            ("opened", "gpu_fault", "node-002/gpu-1"),
            ("updated", "gpu_fault", "node-002/gpu-1"),
        ]
