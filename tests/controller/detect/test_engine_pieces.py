"""The condition engine's pieces on their own: event windows, the lifecycle, naming.

The engine's tests (test_conditions and the kind tests) drive them together; these pin what
each piece promises through its own small interface, on a fake clock.
"""

from __future__ import annotations

from controller.detect.evaluators.base import EventHit
from controller.detect.event_windows import EventWindows
from controller.detect.lifecycle import Lifecycle
from controller.detect.model import Rule
from controller.detect.naming import Naming
from controller.detect.rates import CounterRate
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import NODE, compute_node


def _rule(rule_id: str = "test.rule", *, hold_s: float = 60, resolve_after: int = 2, window_s: float = 30) -> Rule:
    return Rule(
        id=rule_id,
        description="a test rule",
        category="gpu",
        severity="warning",
        action="investigate",
        kind="test",
        params={},
        hold_ms=int(hold_s * 1000),
        resolve_after=resolve_after,
        window_s=window_s,
    )


def _lifecycle(update_s: float = 1.0) -> tuple[Lifecycle, EventWindows, FakeClock]:
    clock = FakeClock(1_000_000)
    windows = EventWindows()
    life = Lifecycle(clock=clock, update_interval_s=update_s, rates=CounterRate(retain_s=120), windows=windows)
    return life, windows, clock


def _hit(comp: str = f"{NODE}/gpu-1", count: int = 1) -> EventHit:
    ev = tpb.Event(kind=tpb.EVENT_KIND_XID, xid=79, severity=tpb.SEVERITY_CRITICAL, timestamp_ms=5)
    return EventHit(NODE, comp, "gpu", NODE, ev, count, 2)


class TestEventWindows:
    def test_counts_inside_the_window_and_drops_what_left_it(self) -> None:
        windows, rule = EventWindows(), _rule(window_s=30)
        assert windows.add(NODE, rule, "c", 2, 1_000) == 2
        assert windows.add(NODE, rule, "c", 1, 20_000) == 3
        assert windows.count(NODE, rule, "c", 31_000) == 1  # the first left the 30 s window
        assert windows.count(NODE, rule, "other", 31_000) == 0

    def test_forget_drops_only_that_nodes_windows(self) -> None:
        windows, rule = EventWindows(), _rule()
        windows.add(NODE, rule, "c", 1, 1_000)
        windows.add("node-009", rule, "c", 1, 1_000)
        windows.forget(NODE)
        assert windows.count(NODE, rule, "c", 1_000) == 0
        assert windows.count("node-009", rule, "c", 1_000) == 1


class TestLifecycle:
    def test_bad_opens_once_and_good_in_a_row_resolves(self) -> None:
        life, _, clock = _lifecycle()
        rule = _rule(resolve_after=2)
        now = clock.time_ms()
        life.bad(rule, "c", "gpu", NODE, NODE, "c: bad", {}, now)
        life.bad(rule, "c", "gpu", NODE, NODE, "c: still bad", {}, now)  # a refresh, not announced again
        # one change; its snapshot is taken at the flush, so it carries the latest state
        assert [(ch.kind, ch.condition.count, ch.condition.message) for ch in life.flush()] == [
            ("opened", 2, "c: still bad")
        ]
        life.good(life.by_owner.get(NODE), rule, "c", now)
        assert life.flush() == []
        life.good(life.by_owner.get(NODE), rule, "c", now)
        assert [(ch.kind, ch.condition.count) for ch in life.flush()] == [("resolved", 2)]
        assert life.active == {} and life.open_at == {}

    def test_a_held_event_condition_expires_after_hold(self) -> None:
        life, _, clock = _lifecycle()
        rule = _rule(hold_s=60)
        life.open_event(rule, _hit(), "msg", {}, 1, clock.time_ms())
        assert [ch.kind for ch in life.flush()] == ["opened"]
        clock.advance(59)
        life.expire()
        assert life.flush() == []
        clock.advance(1)
        life.expire()
        assert [ch.kind for ch in life.flush()] == ["resolved"]

    def test_repeats_inside_the_update_interval_wait_for_expire(self) -> None:
        life, _, clock = _lifecycle(update_s=10)
        rule = _rule()
        life.open_event(rule, _hit(), "msg", {}, 1, clock.time_ms())
        life.flush()
        clock.advance(2)
        assert life.repeat_event(rule, _hit(count=4), clock.time_ms(), stamp=True)
        assert life.flush() == []  # deferred: the last announcement is 2 s old
        clock.advance(8)
        life.expire()
        changes = life.flush()
        assert [(ch.kind, ch.condition.count) for ch in changes] == [("updated", 5)]
        assert changes[0].condition.evidence == {"last_event_ts_ms": 5}

    def test_a_windowed_event_condition_resolves_when_its_window_empties(self) -> None:
        life, windows, clock = _lifecycle()
        rule = _rule(window_s=30)
        hit = _hit()
        windows.add(NODE, rule, hit.component, 3, clock.time_ms())
        life.open_event(rule, hit, "msg", {}, 3, clock.time_ms(), windowed=True)
        life.flush()
        clock.advance(29)
        life.expire()
        assert life.flush() == []
        clock.advance(1)
        life.expire()
        assert [ch.kind for ch in life.flush()] == ["resolved"]

    def test_repeat_event_says_when_nothing_is_open(self) -> None:
        life, _, clock = _lifecycle()
        assert not life.repeat_event(_rule(), _hit(), clock.time_ms(), stamp=False)


class TestNaming:
    def test_a_gpu_event_by_pci_is_named_by_the_inventory_index(self) -> None:
        naming = Naming(None)
        node = compute_node()
        ev = tpb.Event(kind=tpb.EVENT_KIND_XID, component="gpu", pci="00000000:19:00.0")
        assert naming.event_component(node, ev) == (f"{NODE}/gpu-2", "gpu", NODE)

    def test_a_nodes_names_are_cached_until_it_registers_again(self) -> None:
        naming = Naming(None)
        node = compute_node()
        first = naming.node(node)
        assert naming.node(node) is first
        node.stream_token += 1
        assert naming.node(node) is not first

    def test_a_switch_port_without_a_fabric_is_the_port(self) -> None:
        assert Naming(None).port_component("leaf-1", "Ethernet8")[1:] == ("switch", None)
