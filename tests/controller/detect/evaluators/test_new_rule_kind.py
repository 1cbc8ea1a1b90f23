"""A new rule kind is its evaluator and one registry line: the engine is not touched.

The kinds here live only in this test. Each is registered by building a ``Registry`` with
it (what adding one line to ``evaluators/registry.py`` does) and runs through the real
``ConditionEngine`` on a fake clock: events are named and matched by intake, the kind
decides, and the lifecycle opens, holds and resolves, as for the built-in kinds.
"""

from __future__ import annotations

import textwrap
from typing import Any

from controller.detect.conditions import ConditionEngine
from controller.detect.evaluators.base import Derived, EventEvaluator, EventHit, HostEvaluator, Owned, Registry
from controller.detect.evaluators.params import WINDOW, Param, event_kind, list_of
from controller.detect.evaluators.registry import REGISTRY
from controller.detect.model import Defaults, Rule
from controller.detect.rules import RuleSet, parse_rules
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import NODE, compute_node, good_report, opened, resolved


class FlapBurst(EventEvaluator):
    """A test kind: three or more link-down events of one port in its window open a condition
    that stays until the window empties (its own counting, through the engine's windows)."""

    kind = "test_flap_burst"
    params = {"events": Param(list_of(event_kind), required=True), "window": WINDOW}

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        return Derived(window_s=params["window"].value if params.get("window") is not None else 60.0)

    def accepts(self, rule: Rule, severity: int, action: str = "") -> bool:
        return True

    def event(self, rule: Rule, hit: EventHit, now: int) -> None:
        count = self.windows.add(hit.owner, rule, hit.component, hit.count, now)
        if self.judge.repeat_event(rule, hit, now, stamp=True) or count < 3:
            return
        self.judge.open_event(rule, hit, f"{hit.component}: {count} flaps", {"flaps": count}, count, now, windowed=True)


class LoadAbove(HostEvaluator):
    """A test kind of a report family: the host's 1-minute load above 100."""

    kind = "test_load_above"

    def host(self, nid: str, h: tpb.HostSample, now: int, owned: Owned) -> None:
        for rule in self.rules:
            if h.load1 > 100:
                self.bad_on(nid, rule, nid, "node", f"{nid}: load {h.load1:g}", {"load1": h.load1}, now)
            else:
                self.judge.good(owned, rule, nid, now)


def _engine(body: str, *kinds: type) -> tuple[ConditionEngine, FakeClock]:
    """The engine over rules of the given new kinds: the default registry plus one line each."""
    registry = Registry([*REGISTRY, *kinds])
    text = "version: 1\nrules:\n" + textwrap.indent(textwrap.dedent(body), "  ")
    rules: RuleSet = parse_rules(text, "test", registry)
    clock = FakeClock(1_000_000)
    return ConditionEngine(rules, clock=clock), clock


def _link_down(ts: int) -> tpb.Event:
    return tpb.Event(
        kind=tpb.EVENT_KIND_NIC_LINK_DOWN, severity=tpb.SEVERITY_WARNING, component="mlx5_0/1", timestamp_ms=ts
    )


FLAP_RULE = """
- id: test.flap_burst
  description: "a port flapping"
  category: nic_link
  severity: warning
  action: investigate
  kind: test_flap_burst
  events: [nic_link_down]
  window: 60s
"""


class TestANewEventKind:
    def test_it_opens_on_its_own_count_and_resolves_when_its_window_empties(self) -> None:
        engine, clock = _engine(FLAP_RULE, FlapBurst)
        node = compute_node()
        assert engine.on_events(node, [_link_down(clock.time_ms())]) == []
        clock.advance(1)
        assert engine.on_events(node, [_link_down(clock.time_ms())]) == []
        clock.advance(1)
        changes = engine.on_events(node, [_link_down(clock.time_ms())])
        assert [(c.condition.rule, c.condition.node) for c in changes] == [("test.flap_burst", NODE)]
        comp = changes[0].condition.component
        cond = engine.get("test.flap_burst", comp)
        assert cond is not None and cond.count == 3 and cond.evidence == {"flaps": 3}
        clock.advance(30)
        assert engine.tick() == []  # the three are still inside the 60 s window
        clock.advance(31)
        assert resolved(engine.tick()) == [("test.flap_burst", comp)]

    def test_a_further_event_counts_on_the_open_condition(self) -> None:
        engine, clock = _engine(FLAP_RULE, FlapBurst)
        node = compute_node()
        for _ in range(3):
            engine.on_events(node, [_link_down(clock.time_ms())])
            clock.advance(1)
        clock.advance(5)  # past the update interval: the repeat is announced
        changes = engine.on_events(node, [_link_down(clock.time_ms())])
        assert [c.kind for c in changes] == ["updated"]
        assert changes[0].condition.count == 4
        assert changes[0].condition.evidence["last_event_ts_ms"] == clock.time_ms()


class TestANewReportKind:
    def test_it_is_asked_about_each_report_and_resolves_on_good_ones(self) -> None:
        engine, clock = _engine(
            """
            - id: test.load
              description: "host overloaded"
              category: host
              severity: warning
              action: investigate
              kind: test_load_above
              resolve_after: 2
            """,
            LoadAbove,
        )
        node = compute_node()
        hot = good_report(clock.time_ms())
        hot.host.load1 = 250.0
        assert opened(engine.on_report(node, hot)) == [("test.load", NODE)]
        calm = [good_report(clock.time_ms() + 10_000), good_report(clock.time_ms() + 20_000)]
        for r in calm:
            r.host.load1 = 1.0
        clock.advance(10)
        assert engine.on_report(node, calm[0]) == []  # one good report of the two it needs
        clock.advance(10)
        assert resolved(engine.on_report(node, calm[1])) == [("test.load", NODE)]

    def test_a_registered_kind_without_rules_judges_nothing(self) -> None:
        """Registered, but with no rule of its kind in use, the engine builds no evaluator for it."""
        engine, clock = _engine(FLAP_RULE, FlapBurst, LoadAbove)
        hot = good_report(clock.time_ms())
        hot.host.load1 = 250.0
        assert opened(engine.on_report(compute_node(), hot)) == []
