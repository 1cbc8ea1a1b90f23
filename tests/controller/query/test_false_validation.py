"""False successes of validation (issue 28 leftovers, item 3).

A node the repair ladder returned 'validated' that fails again with the same cause within a day
was passed by a validation that did not see its fault. The history is written through the
controller's own stores on a FakeClock (the rows the healer and the repair loop write), with
four returns worked out by hand:

- ``a``: an Xid back 10 h after its return (same cause, ``gpu``): a false success;
- ``b``: a NIC fault 5 h after its GPU repair: another cause, not one;
- ``c``: the same Xid again, but 30 h after: outside the day, not one;
- ``d``: returned 2 h before the report's end, nothing since: pending, judged neither way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.heal.inservice import FleetServiceLedger
from controller.heal.states import NodeHealState, RemediationStore
from controller.metrics import ControllerMetrics
from controller.query.fleet import CAUSES, ReportSettings, fleet_report, headline
from controller.query.history import HistoryKeeper, report_with_history
from controller.query.store import StoreQueries
from controller.store import Store
from starpulse.app.cli.report import report_lines
from starpulse.core.clock import FakeClock

S = NodeHealState
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
T0 = 1_700_006_400_000  # a UTC midnight
END = T0 + 10 * DAY_MS
XID = ["gpu.xid.reboot"]


def _open(store: Store, clock: FakeClock, kind: str, node: str, rules: list[str]) -> str:
    inc = IncidentStore(store.connection).open(
        Incident(id="", kind=kind, root_cause=f"{node}/x", component_type="gpu", affected_nodes=[node],
                 affected_jobs=[], severity="critical", action="reboot", evidence=[{"rule": r} for r in rules],
                 opened_ms=clock.time_ms())
    )  # fmt: skip
    return inc.id


def _repaired(store: Store, heal: RemediationStore, clock: FakeClock, node: str, at_ms: int) -> str:
    """An Xid on ``node`` at ``at_ms``: evicted, rebooted, validated and back an hour later."""
    clock.set_ms(at_ms)
    incident = _open(store, clock, "gpu_fault", node, XID)
    for state in (S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING):
        heal.transition(node, state, "r", incident)
    clock.advance(3600)
    heal.transition(node, S.IN_SERVICE, "validated", incident)
    IncidentStore(store.connection).resolve(IncidentStore(store.connection).get(incident), clock.time_ms())  # type: ignore[arg-type]
    return incident


def _again(store: Store, clock: FakeClock, node: str, after_ms: int, kind: str, rules: list[str]) -> None:
    clock.set_ms(clock.time_ms() + after_ms)
    _open(store, clock, kind, node, rules)


@pytest.fixture
def history(tmp_path: Path) -> Store:
    store = Store(tmp_path / "c.db")
    clock = FakeClock(start_ms=T0)
    FleetServiceLedger(store.connection).sync({n: (8, T0) for n in "abcd"}, set(), T0)
    heal = RemediationStore(store.connection, clock)
    _repaired(store, heal, clock, "a", T0 + DAY_MS)
    _again(store, clock, "a", 10 * HOUR_MS, "gpu_fault", XID)
    _repaired(store, heal, clock, "b", T0 + 2 * DAY_MS)
    _again(store, clock, "b", 5 * HOUR_MS, "nic_fault", ["nic.link_down"])
    _repaired(store, heal, clock, "c", T0 + 3 * DAY_MS)
    _again(store, clock, "c", 30 * HOUR_MS, "gpu_fault", XID)
    _repaired(store, heal, clock, "d", END - 3 * HOUR_MS)  # back at END - 2 h
    _again(store, clock, "a", 0, "gpu_fault", XID)  # a third fault for a: a lemon (3 in 28 d)
    return store


class TestFalseValidation:
    def test_a_return_that_fails_again_with_the_same_cause_within_a_day_is_a_false_success(
        self, history: Store
    ) -> None:
        report = fleet_report(history.connection, T0, END)
        assert report.validated_returns == 4
        assert [(f["node"], f["cause"]) for f in report.false_validations] == [("a", "gpu")]
        assert report.false_validation_pending == 1  # d
        assert report.false_validation_share == pytest.approx(1 / 3)  # a of a, b, c (d not judged yet)
        body = report.to_dict()["validation"]
        assert (body["returns"], body["false_successes"], body["pending"]) == (4, 1, 1)

    def test_the_lemon_list_names_each_lemons_false_successes(self, history: Store) -> None:
        report = fleet_report(history.connection, T0, END)
        assert report.lemons == [{"node": "a", "faults": 3, "false_validations": 1}]
        assert any("a (3, 1 false validation(s))" in line for line in report_lines(report.to_dict()))

    def test_pending_turns_into_judged_as_time_passes(self, history: Store) -> None:
        later = fleet_report(history.connection, T0, END, as_of_ms=END + DAY_MS)
        assert later.false_validation_pending == 0
        assert later.false_validation_share == pytest.approx(1 / 4)

    def test_the_figures_survive_the_raw_horizon_as_daily_aggregates(self, history: Store) -> None:
        now = T0 + 40 * DAY_MS
        HistoryKeeper(history.connection, retention_s=30 * 86400.0).sweep(now)  # days 0..9 aggregated, raw gone
        assert fleet_report(history.connection, T0, now).validated_returns == 0
        report = report_with_history(history.connection, T0, now)
        body = report.to_dict()["validation"]
        assert (body["returns"], body["false_successes"], body["pending"]) == (4, 1, 0)
        assert body["share"] == pytest.approx(1 / 4)

    def test_prometheus_carries_the_count_and_the_share(self, history: Store) -> None:
        clock = FakeClock(start_ms=END)
        metrics = ControllerMetrics(registry=CollectorRegistry())
        metrics.set_fleet_report_source(
            lambda: headline(StoreQueries(history, clock).fleet_report(30 * 86400.0, ReportSettings())), CAUSES
        )
        registry = metrics.registry
        assert registry.get_sample_value("starpulse_fleet_false_validations") == 1.0
        assert registry.get_sample_value("starpulse_fleet_false_validation_ratio") == pytest.approx(1 / 3)
