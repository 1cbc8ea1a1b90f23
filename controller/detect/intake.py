"""Event intake: a batch of events from one node, named and handed to the kinds they match.

Which rules an event matches is the rule set's dispatch table (``RuleSet.event_rules``);
what a match does is the kind's (``Evaluator.event``: the event kind holds and counts, a
state kind opens early). An event kind listed in a rule's ``resolve_on`` resolves that
rule's condition on the event's component. Intake knows no kind: a new one needs no change here.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.detect.evaluators.base import Evaluator, EventHit
from controller.detect.lifecycle import Lifecycle
from controller.detect.naming import Naming
from controller.detect.rules import RuleSet
from controller.ingest.registry import NodeRecord
from starpulse.core.findings import event_kind_name
from starpulse.v1 import telemetry_pb2 as tpb

_EVENT_SEVERITY = {
    tpb.SEVERITY_UNSPECIFIED: 1,  # unknown: treat as a warning, never as 'restored'
    tpb.SEVERITY_INFO: 0,
    tpb.SEVERITY_WARNING: 1,
    tpb.SEVERITY_CRITICAL: 2,
    tpb.SEVERITY_FATAL: 3,
}


class EventIntake:
    """Applies events to the engine's rules (into the lifecycle's batch; the engine flushes)."""

    def __init__(
        self, rules: RuleSet, evaluators: Mapping[str, Evaluator], naming: Naming, lifecycle: Lifecycle
    ) -> None:
        self._rules = rules
        self._evaluators = evaluators
        self._naming = naming
        self._life = lifecycle

    def on_events(self, node: NodeRecord, events: list[tpb.Event], now: int) -> None:
        rules = self._rules
        evaluators = self._evaluators
        component = self._naming.event_component
        for ev in events:
            kind = ev.kind
            for rule in rules.resolving_event.get(kind, ()):
                comp, _, _ = component(node, ev)
                self._life.clear(rule, comp, now, reason=event_kind_name(kind))
            matched = rules.event_rules(kind, ev.xid, ev.action)
            if not matched:
                continue
            comp, ctype, owner_node = component(node, ev)
            severity = _EVENT_SEVERITY.get(ev.severity, 0)
            hit = EventHit(node.node_id, comp, ctype, owner_node, ev, _occurrences(ev), severity)
            for rule in matched:
                evaluators[rule.kind].event(rule, hit, now)


def _occurrences(ev: tpb.Event) -> int:
    """How many occurrences an event stands for: an agent storm summary carries 'suppressed'."""
    suppressed = ev.attributes.get("suppressed") if ev.attributes else None
    if suppressed:
        try:
            return max(int(suppressed), 1)
        except ValueError:
            return 1
    return 1
