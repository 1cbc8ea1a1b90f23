"""Saturated IBA / NVLink counters: reaching the maximum is a fault, sitting at it is a note.

Real nodes run for months with ``excessive_buffer_overrun_errors`` at 15 and ``link_downed``
at 255 (the recorded H100 tree does). A counter at its maximum since first sight can show no
new errors: that is an info-level condition asking to clear the counters, never a warning or
an eviction. A counter that climbs to its maximum inside the window counted errors just now,
and its delta is only a lower bound ("at least"): that fires the rule. A counter that goes
down was cleared: what it counts after that is judged like any other delta.
"""

from __future__ import annotations

import sqlite3

from controller.detect.conditions import ConditionEngine
from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.incidents import IncidentStore
from controller.detect.model import Condition, ConditionChange
from controller.heal.policy import ALERT_ONLY, load_policy
from starpulse.core.clock import FakeClock
from tests.support.conditions import NODE, compute_node, good_report, make_engine, opened

NIC = f"{NODE}/nic-5"
PHY = ("nic.phy_errors", NIC)
FLAP = ("nic.flap", NIC)
U64 = 0xFFFF_FFFF_FFFF_FFFF


def feed(engine: ConditionEngine, clock: FakeClock, values: list[dict[str, int]], step_s: float = 20) -> list:
    """One report per mapping of ``counters`` values on NIC 5, ``step_s`` apart; every change."""
    node = compute_node()
    changes: list[ConditionChange] = []
    for counters in values:
        r = good_report(clock.time_ms())
        for name, value in counters.items():
            r.nics[5].counters[name] = value
        changes += engine.on_report(node, r)
        changes += engine.tick()
        clock.advance(step_s)
    return changes


def test_reaching_the_maximum_inside_the_window_fires_as_at_least() -> None:
    """14 -> 15 on a 4-bit counter is one error by delta (below 0.1/s over 60 s), but the counter
    can count no more: it fires nic.phy_errors as a warning, saying 'at least'."""
    engine, clock = make_engine()
    changes = feed(engine, clock, [{"excessive_buffer_overrun_errors": v} for v in (13, 14, 15)])
    assert PHY in opened(changes)
    cond = engine.get(*PHY)
    assert cond is not None
    assert (cond.severity, cond.action) == ("warning", "check_link")
    assert cond.evidence["saturated"] is True and cond.evidence["at_least"] is True
    assert "at least" in cond.message and "excessive_buffer_overrun_errors" in cond.message


def test_below_the_maximum_the_same_delta_opens_nothing() -> None:
    """The control: 12 -> 13 -> 14 is the same one error per read and stays quiet."""
    engine, clock = make_engine()
    changes = feed(engine, clock, [{"excessive_buffer_overrun_errors": v} for v in (12, 13, 14)])
    assert changes == [] and engine.active() == []


def test_stuck_at_the_maximum_from_first_sight_is_an_info_note() -> None:
    """15 and 255 on every read, for longer than both windows: info conditions that say to clear
    the counters, never a warning."""
    engine, clock = make_engine()
    values = [{"excessive_buffer_overrun_errors": 15, "link_downed": 255}] * 40  # 40 reads, 20 s apart
    changes = feed(engine, clock, values)
    for key in (PHY, FLAP):
        cond = engine.get(*key)
        assert cond is not None, key
        assert (cond.severity, cond.action) == ("info", "none")
        assert "clear the port counters (perfquery -R / reset)" in cond.message
        assert "it can no longer show new errors" in cond.message
        assert cond.evidence["stuck"] is True and cond.evidence["at_least"] is False
    assert engine.get(*FLAP).evidence["value"] == 255  # type: ignore[union-attr]
    assert all(ch.condition.severity == "info" for ch in changes if ch.condition.key in (PHY, FLAP))


def test_a_counter_that_reached_its_maximum_turns_into_the_note_once_the_window_passes() -> None:
    """Reached at one read: a warning; still at it a window later: 'blind since', the info note."""
    engine, clock = make_engine()
    feed(engine, clock, [{"excessive_buffer_overrun_errors": 14}, {"excessive_buffer_overrun_errors": 15}])
    assert engine.get(*PHY).severity == "warning"  # type: ignore[union-attr]
    feed(engine, clock, [{"excessive_buffer_overrun_errors": 15}] * 5)  # 100 s: past the 60 s window
    cond = engine.get(*PHY)
    assert cond is not None and (cond.severity, cond.action) == ("info", "none")


def test_a_cleared_counter_is_not_a_burst_and_the_note_resolves() -> None:
    """perfquery -R: 255 -> 0 and 15 -> 0, then a few errors: no warning, and the note goes."""
    engine, clock = make_engine()
    stuck = {"excessive_buffer_overrun_errors": 15, "link_downed": 255}
    feed(engine, clock, [stuck] * 3)
    assert engine.get(*PHY) is not None
    cleared = [{"excessive_buffer_overrun_errors": 0, "link_downed": 0}, {"excessive_buffer_overrun_errors": 1}]
    changes = feed(engine, clock, cleared + [{"excessive_buffer_overrun_errors": 1, "link_downed": 1}] * 40)
    assert not [ch for ch in changes if ch.condition.severity != "info" and ch.kind != "resolved"]
    assert engine.get(*PHY) is None and engine.get(*FLAP) is None


def test_a_wrapped_64_bit_counter_is_not_a_burst() -> None:
    """A driver counter near 2**64 that comes back small (a wrap or reload) is a small delta."""
    engine, clock = make_engine()
    node = compute_node()
    for value in (U64 - 3, 2, 2):
        r = good_report(clock.time_ms())
        r.nics[5].hw_counters["out_of_sequence"] = value
        assert engine.on_report(node, r) == []
        clock.advance(20)


def test_nvlink_counter_stuck_at_its_maximum_is_a_note_and_reaching_it_fires() -> None:
    """The NVLink counter rule judges saturation the same way as the NIC one."""
    engine, clock = make_engine()
    node = compute_node()
    key = ("gpu.nvlink_errors", f"{NODE}/gpu-5")
    for _ in range(3):
        r = good_report(clock.time_ms(), links=4)
        r.gpus[5].nvlinks[0].crc_flit_errors = 0  # quiet links first: the worst by value alone is one of them
        r.gpus[5].nvlinks[2].crc_data_errors = U64
        engine.on_report(node, r)
        clock.advance(60)
    cond = engine.get(*key)
    assert cond is not None and (cond.severity, cond.action) == ("info", "none")
    assert cond.evidence["stuck"] is True and cond.evidence["link"] == 2
    assert cond.evidence["counter"] == "crc_data_errors" and "can no longer show new errors" in cond.message

    engine, clock = make_engine()
    for value in (U64 - 1, U64):
        r = good_report(clock.time_ms(), links=4)
        r.gpus[5].nvlinks[2].crc_data_errors = value
        engine.on_report(node, r)
        clock.advance(60)
    cond = engine.get(*key)
    assert cond is not None and (cond.severity, cond.action) == ("warning", "investigate")
    assert cond.evidence["saturated"] is True and cond.evidence["link"] == 2 and "at least" in cond.message


def _decisions(conds: list[Condition], clock: FakeClock) -> list[tuple[str, str, str]]:
    """(incident kind, severity, policy action) for each incident the correlator opens."""
    store = IncidentStore(sqlite3.connect(":memory:", isolation_level=None))
    corr = Correlator(None, store, CorrelationConfig(settle_s=2.0, resolve_hold_s=60.0), clock=clock)
    corr.on_changes(ConditionChange("opened", c) for c in conds)
    clock.advance(3)
    policy = load_policy()
    return [(inc.kind, inc.severity, policy.decide(inc).action) for change, inc in corr.tick() if change == "opened"]


def test_the_note_never_evicts_but_reaching_the_maximum_does() -> None:
    """Through the correlator and the default self-healing policy: the stuck counters' info
    conditions only alert; a counter that reached its maximum just now is a NIC fault."""
    engine, clock = make_engine()
    feed(engine, clock, [{"excessive_buffer_overrun_errors": 15, "link_downed": 255}] * 5)
    decided = _decisions(engine.active(), clock)
    assert decided and all(action == ALERT_ONLY for _, _, action in decided), decided

    engine, clock = make_engine()
    feed(engine, clock, [{"excessive_buffer_overrun_errors": v} for v in (14, 15)])
    decided = _decisions(engine.active(), clock)
    assert [(kind, sev) for kind, sev, _ in decided] == [("nic_fault", "warning")]
    assert decided[0][2] != ALERT_ONLY
