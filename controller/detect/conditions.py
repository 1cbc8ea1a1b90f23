"""The condition engine: events, reports and presence in; opened/updated/resolved conditions out.

It composes four pieces, each with one job, all built here up front (nothing is assigned
to them afterwards):

- naming (controller.detect.naming): fabric names of GPUs, NIC ports, switch ports, and of
  an event's component, cached per node registration;
- the fast-path plan (controller.detect.plan) and the report path that walks it
  (controller.detect.reports): each sample read once, each evaluator asked about what it
  can judge;
- event intake (controller.detect.intake) and its windows (controller.detect.event_windows): each
  event named and handed to the kinds whose rules it matches;
- the condition lifecycle (controller.detect.lifecycle): open, hold, windows, updates at
  most once per interval, ``resolve_after``, expiry; the evaluators' ``Judge``.

What is bad is the evaluators' to say (controller.detect.evaluators: one per rule kind,
listed in one registry). No piece here names a kind, so a new rule kind is its evaluator
and one registry line.
"""

from __future__ import annotations

import structlog

from controller.detect.event_windows import EventWindows
from controller.detect.intake import EventIntake
from controller.detect.lifecycle import Lifecycle
from controller.detect.model import Condition, ConditionChange
from controller.detect.naming import Naming, nic_fabric_evidence
from controller.detect.plan import build_plan
from controller.detect.rates import CounterRate
from controller.detect.reports import ReportPath
from controller.detect.rules import RuleSet
from controller.fabric import Fabric
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import Clock
from starpulse.v1 import telemetry_pb2 as tpb

__all__ = ["ConditionEngine", "nic_fabric_evidence"]

log = structlog.get_logger(__name__)


class ConditionEngine:
    """Applies a RuleSet to what agents send; keeps the active conditions.

    Not thread-safe: call it from the controller's event loop, as the registry does.
    Changes returned carry snapshots; ``active()`` returns the live conditions (read only).
    """

    def __init__(
        self,
        rules: RuleSet,
        fabric: Fabric | None = None,
        *,
        clock: Clock,
        rates: CounterRate | None = None,
    ) -> None:
        self.rules = rules
        self.fabric = fabric
        self.clock = clock
        self._clock = clock.time_ms
        longest = max((r.window_s for r in rules.rules), default=0.0)
        self.rates = rates or CounterRate(retain_s=max(longest, rules.defaults.flap_window_s) + 60.0)
        self._naming = Naming(fabric)
        self._windows = EventWindows()
        self._life = Lifecycle(
            clock=clock, update_interval_s=rules.defaults.update_interval_s, rates=self.rates, windows=self._windows
        )
        plan = build_plan(rules, judge=self._life, names=self._naming, windows=self._windows, rates=self.rates)
        self._reports = ReportPath(
            plan, self._naming, self._life, self.rates, int(rules.defaults.counter_interval_s * 1000)
        )
        self._intake = EventIntake(rules, plan.evaluators, self._naming, self._life)
        self.view = plan.view
        self._flush = self._life.flush

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> list[ConditionChange]:
        """Apply a batch of new events from one node."""
        self._intake.on_events(node, events, self._clock())
        return self._flush()

    def on_report(self, node: NodeRecord, report: tpb.Report) -> list[ConditionChange]:
        """Evaluate every report-driven rule against one report."""
        self._reports.on_report(node, report, self._clock())
        return self._flush()

    def on_presence(self, node: NodeRecord, old: str, new: str) -> list[ConditionChange]:
        """Heartbeat (compute) or switch-silent (switch) conditions from presence changes."""
        self._reports.on_presence(node, old, new, self._clock())
        return self._flush()

    def tick(self) -> list[ConditionChange]:
        """Time-driven work: hold expiry, emptied windows, deferred updates. Call about once a second."""
        self._life.expire()
        return self._flush()

    def active(self) -> list[Condition]:
        """The active conditions (live objects: do not mutate)."""
        return self._life.conditions()

    def get(self, rule: str, component: str) -> Condition | None:
        return self._life.get(rule, component)

    def forget(self, node_id: str) -> list[ConditionChange]:
        """A node left: resolve what its data drives and drop its counters, windows and naming."""
        self._life.forget(node_id)
        self._naming.forget(node_id)
        self._windows.forget(node_id)
        self._reports.forget(node_id)
        dropped = self.rates.forget(node_id)
        log.info("condition_node_forgotten", node=node_id, counters_dropped=dropped)
        return self._flush()
