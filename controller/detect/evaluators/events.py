"""The event kind: an event (or a count of events within a window) opens a condition.

Which events match a rule (its event kinds, and for Xids the Xid numbers or the catalog
bucket) is the rule set's dispatch table (controller.detect.rules.RuleSet.event_rules).
This kind decides what a matching event does (``event``): an event it ``accepts`` opens a
condition held for ``hold`` after its last event, or, for counted events (``min_count`` in
a ``window``), one that opens when the window holds enough and resolves when it empties.
The engine's lifecycle keeps the condition; no engine code knows this kind.
"""

from __future__ import annotations

from typing import Any

from controller.detect.evaluators.base import Derived, EventEvaluator, EventHit
from controller.detect.evaluators.event_text import event_evidence, event_message
from controller.detect.evaluators.params import WINDOW, Param, event_kind, integer, list_of, one_of
from controller.detect.model import Defaults, Rule
from starpulse.core import vocab
from starpulse.core.findings import event_kind_name
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import telemetry_pb2 as tpb

_XID_KINDS = frozenset({tpb.EVENT_KIND_XID, tpb.EVENT_KIND_SXID})


class EventRule(EventEvaluator):
    """An event (or a count of events within a window). Resolves hold after the last one."""

    kind = "event"
    params = {
        "events": Param(list_of(event_kind), required=True),
        "xids": Param(list_of(integer(1))),
        "xid_action": Param(one_of(vocab.ACTIONS)),  # Xids whose catalog bucket maps to this action
        "min_count": Param(integer(1), default=1),
        "window": WINDOW,
        "min_event_severity": Param(one_of(tuple(SEVERITY_ORDER))),
        "resolve_on": Param(list_of(event_kind)),
        # Only events whose own recommended action is one of these (a vendor's fault code carries
        # the action its catalog level maps to: accel_fault events of Ascend, AMD, plugins).
        "event_actions": Param(list_of(one_of(vocab.ACTIONS))),
    }

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        if params.get("xids") and params.get("xid_action") is not None:
            errors.append(f"{where}: 'xids' and 'xid_action' are exclusive: pick one")
        if (params.get("xids") or params.get("xid_action") is not None) and not set(params["events"]) & _XID_KINDS:
            errors.append(f"{where}: 'xids'/'xid_action' need 'events' to include xid or sxid")
        window = params.get("window")
        if window is not None and params.get("min_count", 1) == 1:
            errors.append(f"{where}: 'window' needs 'min_count' above 1 (events counted in the window)")
        window_s = window.value if window is not None else 0.0
        if params.get("min_count", 1) > 1 and window is None:
            window_s = defaults.flap_window_s
        return Derived(window_s=window_s)

    def accepts(self, rule: Rule, severity: int, action: str = "") -> bool:
        floor = rule.params.get("min_event_severity")
        if floor is not None and severity < SEVERITY_ORDER[floor]:
            return False
        actions = rule.params.get("event_actions")
        # An event that names no action of its own (an older agent's) is one to investigate.
        return not actions or (action or vocab.ACTION_INVESTIGATE) in actions

    def event(self, rule: Rule, hit: EventHit, now: int) -> None:
        if not self.accepts(rule, hit.severity, hit.event.action):
            return
        min_count = rule.params.get("min_count", 1)
        if min_count <= 1:
            if not self.judge.repeat_event(rule, hit, now, stamp=True):
                self.judge.open_event(
                    rule,
                    hit,
                    event_message(hit.component, hit.event),
                    event_evidence(hit.event, hit.count),
                    hit.count,
                    now,
                )
            return
        count = self.windows.add(hit.owner, rule, hit.component, hit.count, now)
        if self.judge.repeat_event(rule, hit, now, stamp=True) or count < min_count:
            return
        ev = hit.event
        kind, window_s = event_kind_name(ev.kind), rule.window_s
        msg = f"{hit.component}: {count} {kind} events in {window_s:g}s (threshold {min_count})"
        self.judge.open_event(rule, hit, msg, event_evidence(ev, count), count, now, windowed=True)
