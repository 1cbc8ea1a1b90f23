"""The condition lifecycle: open, refresh, hold, update at most once per interval, resolve.

A condition is keyed (rule, component), so a storm is one condition with a count: 10,000
identical Xids are one condition, count 10,000, announced once and then updated at most
once per ``update_interval`` (the rest is folded into the next update or ``tick``).

- held (an event opened it): active until ``hold`` passes without a new event, or until a
  report confirms it (a state rule opened early);
- windowed (a count rule: events, or counter increments, within a window): active until the
  window empties;
- state (a report showed the bad state): resolved after ``resolve_after`` good reports in a row.

This is the evaluators' ``Judge`` (controller.detect.evaluators.base): they say ``bad``,
``good``, ``clear``, or for events ``repeat_event`` / ``open_event``; what that does to a
condition is decided here, and nowhere else. Changes are batched until ``flush``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from controller.detect.evaluators.base import EventHit
from controller.detect.event_windows import EventWindows
from controller.detect.model import ComponentType, Condition, ConditionChange, ConditionChangeKind, Rule
from controller.detect.rates import CounterRate
from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

Key = tuple[str, str]


@dataclass(slots=True)
class Entry:
    """Lifecycle bookkeeping around one active condition."""

    cond: Condition
    rule: Rule
    owner: str  # node_id of the agent whose data drives it
    touched_ms: int  # controller time of the last bad observation (hold runs from here)
    emitted_ms: int  # controller time of the last opened/updated change
    good: int = 0  # good observations in a row
    confirmed: bool = False  # a report showed the bad state (state rules)
    dirty: bool = False  # changed since the last emitted change
    entity: str = ""  # counter entity, for windowed counter rules
    counters: tuple[str, ...] = ()  # the counters whose window it watches
    by_events: bool = False  # windowed by its events (EventWindows), not by counters


class Lifecycle:
    """The active conditions and what happens to them. Not thread-safe (one event loop)."""

    def __init__(self, *, clock: Clock, update_interval_s: float, rates: CounterRate, windows: EventWindows) -> None:
        self._clock = clock.time_ms
        self._update_ms = int(update_interval_s * 1000)
        self._rates = rates
        self._windows = windows
        self.active: dict[Key, Entry] = {}
        # node -> its open conditions by key (the report path reads it: never rebound)
        self.by_owner: dict[str, dict[Key, Entry]] = {}
        # component -> how many conditions (of any rule) are open on it (never rebound)
        self.open_at: dict[str, int] = {}
        self._held: dict[Key, Entry] = {}  # resolve on hold expiry
        self._windowed: dict[Key, Entry] = {}  # resolve when their window empties
        self._dirty: dict[Key, Entry] = {}  # updates deferred by the rate limit
        self._batch: list[list[Any]] = []  # [kind, entry, snapshot | None]
        self._batch_idx: dict[Key, int] = {}

    # -- the Judge -------------------------------------------------------------------------

    def bad(
        self,
        rule: Rule,
        comp: str,
        ctype: ComponentType,
        node: str | None,
        owner: str,
        message: str,
        evidence: dict[str, Any],
        now: int,
        *,
        action: str | None = None,
        severity: str | None = None,
        window: tuple[str, tuple[str, ...]] | None = None,
    ) -> None:
        """A report shows the bad state: open, or refresh silently (announce only a changed verdict).

        ``window``: (entity, counters) of a count rule, which resolves when that window empties."""
        key = (rule.id, comp)
        entry = self.active.get(key)
        if entry is None:
            entry = self._open(
                rule, comp, ctype, node, owner, message, evidence, now, 1, action=action, severity=severity
            )
            entry.confirmed = True
        else:
            self._refresh(entry, message, evidence, now, action, severity)
        if window is not None:
            entry.entity, entry.counters = window
            self._windowed[key] = entry

    def good(self, owned: Mapping[Key, Entry] | None, rule: Rule, comp: str, now: int) -> None:
        """A report shows the good state: after ``resolve_after`` in a row, resolve."""
        if not owned:
            return
        entry = owned.get((rule.id, comp))
        if entry is None:
            return
        entry.good += 1
        if entry.good >= rule.resolve_after:
            self._resolve(entry, now, reason="good_state")

    def clear(self, rule: Rule, comp: str, now: int, reason: str) -> None:
        """The bad state is over for certain: resolve now."""
        entry = self.active.get((rule.id, comp))
        if entry is not None:
            self._resolve(entry, now, reason=reason)

    def repeat_event(self, rule: Rule, hit: EventHit, now: int, *, stamp: bool) -> bool:
        """Another matching event on an open condition: count it (``stamp``: note its time in
        the evidence, as event conditions do). False when none is open."""
        entry = self.active.get((rule.id, hit.component))
        if entry is None:
            return False
        cond = entry.cond
        cond.count += hit.count
        cond.last_seen_ms = now
        entry.touched_ms = now
        if stamp:
            cond.evidence["last_event_ts_ms"] = hit.event.timestamp_ms
        else:
            entry.good = 0
        self._repeat(entry, now)
        return True

    def open_event(
        self,
        rule: Rule,
        hit: EventHit,
        message: str,
        evidence: dict[str, Any],
        count: int,
        now: int,
        *,
        windowed: bool = False,
    ) -> Condition:
        """Open a condition from an event: held for ``hold`` (until a report confirms it), or,
        ``windowed``, active until its event window empties. Returns the live condition."""
        entry = self._open(rule, hit.component, hit.ctype, hit.node, hit.owner, message, evidence, now, count)
        key = entry.cond.key
        if windowed:
            entry.confirmed = True
            entry.by_events = True
            self._windowed[key] = entry
        else:
            self._held[key] = entry
        return entry.cond

    # -- time, queries, nodes leaving ------------------------------------------------------

    def expire(self) -> None:
        """Hold expiry, emptied windows, deferred updates (into the batch)."""
        now = self._clock()
        for entry in list(self._held.values()):
            if now - entry.touched_ms >= entry.rule.hold_ms:
                self._resolve(entry, now, reason="hold_expired")
        for key, entry in list(self._windowed.items()):
            if key not in self.active:
                continue
            if not self._window_count(entry, now):
                self._resolve(entry, now, reason="window_empty")
        for entry in list(self._dirty.values()):
            if entry.cond.key in self.active and now - entry.emitted_ms >= self._update_ms:
                self._emit("updated", entry, now)

    def get(self, rule: str, component: str) -> Condition | None:
        entry = self.active.get((rule, component))
        return None if entry is None else entry.cond

    def conditions(self) -> list[Condition]:
        """The active conditions (live objects: do not mutate)."""
        return [e.cond for e in self.active.values()]

    def forget(self, node_id: str) -> None:
        """Resolve what node ``node_id``'s data drives (into the batch)."""
        now = self._clock()
        for entry in list(self.by_owner.get(node_id, {}).values()):
            self._resolve(entry, now, reason="forgotten")
        self.by_owner.pop(node_id, None)

    def flush(self) -> list[ConditionChange]:
        """The changes batched since the last flush, each with a snapshot of its condition."""
        if not self._batch:
            return []
        out = [
            ConditionChange(kind, snap if snap is not None else _snapshot(entry.cond))
            for kind, entry, snap in self._batch
        ]
        self._batch.clear()
        self._batch_idx.clear()
        return out

    # -- inside ----------------------------------------------------------------------------

    def _window_count(self, entry: Entry, now: int) -> int:
        """Events or counter increments still inside the entry's window."""
        rule = entry.rule
        if entry.by_events:
            return self._windows.count(entry.owner, rule, entry.cond.component, now)
        total = 0
        for key in entry.counters:
            count, saturated = self._rates.window_sum(entry.entity, key, rule.window_s, now)
            total += count + (1 if saturated else 0)
        return total

    def _refresh(
        self, entry: Entry, message: str, evidence: dict[str, Any], now: int, action: str | None, severity: str | None
    ) -> None:
        cond = entry.cond
        cond.count += 1
        cond.last_seen_ms = now
        cond.message = message
        keep: dict[str, Any] = {k: cond.evidence[k] for k in ("first_event_ts_ms", "event") if k in cond.evidence}
        cond.evidence = {**evidence, **keep}
        entry.touched_ms = now
        entry.good = 0
        if not entry.confirmed:
            entry.confirmed = True  # a report confirms what an event opened: it no longer expires
            self._held.pop(cond.key, None)
        changed = (action is not None and action != cond.action) or (severity is not None and severity != cond.severity)
        if changed:
            cond.action = action or cond.action
            cond.severity = severity or cond.severity  # type: ignore[assignment]
            self._repeat(entry, now)

    def _open(
        self,
        rule: Rule,
        comp: str,
        ctype: ComponentType,
        node: str | None,
        owner: str,
        message: str,
        evidence: dict[str, Any],
        now: int,
        count: int,
        *,
        action: str | None = None,
        severity: str | None = None,
    ) -> Entry:
        cond = Condition(
            rule=rule.id,
            component=comp,
            component_type=ctype,
            category=rule.category,
            node=node,
            severity=(severity or rule.severity),  # type: ignore[arg-type]
            action=action or rule.action,
            message=message,
            first_seen_ms=now,
            last_seen_ms=now,
            count=count,
            evidence=evidence,
        )
        entry = Entry(cond, rule, owner, now, now)
        self.active[cond.key] = entry
        self.by_owner.setdefault(owner, {})[cond.key] = entry
        self.open_at[comp] = self.open_at.get(comp, 0) + 1
        log.info(
            "condition_opened", rule=rule.id, component=comp, severity=cond.severity, action=cond.action, count=count
        )
        self._emit("opened", entry, now)
        return entry

    def _repeat(self, entry: Entry, now: int) -> None:
        """A changed condition: announce it now, or defer within the update interval."""
        key = entry.cond.key
        idx = self._batch_idx.get(key)
        if idx is not None and self._batch[idx][2] is None:
            return  # an opened/updated change in this batch will carry the latest state
        if now - entry.emitted_ms >= self._update_ms:
            self._emit("updated", entry, now)
        else:
            entry.dirty = True
            self._dirty[key] = entry

    def _resolve(self, entry: Entry, now: int, reason: str) -> None:
        cond = entry.cond
        key = cond.key
        if self.active.get(key) is not entry:
            return
        self._finalize(key)
        del self.active[key]
        owned = self.by_owner.get(entry.owner)
        if owned is not None:
            owned.pop(key, None)
        left = self.open_at.pop(cond.component, 1) - 1
        if left:
            self.open_at[cond.component] = left
        self._held.pop(key, None)
        self._windowed.pop(key, None)
        self._dirty.pop(key, None)
        cond.resolved_ms = now
        log.info("condition_resolved", rule=cond.rule, component=cond.component, reason=reason, count=cond.count)
        self._batch.append(["resolved", entry, _snapshot(cond)])

    def _emit(self, kind: ConditionChangeKind, entry: Entry, now: int) -> None:
        key = entry.cond.key
        self._finalize(key)
        self._batch_idx[key] = len(self._batch)
        self._batch.append([kind, entry, None])
        entry.emitted_ms = now
        entry.dirty = False
        self._dirty.pop(key, None)

    def _finalize(self, key: Key) -> None:
        idx = self._batch_idx.pop(key, None)
        if idx is not None and self._batch[idx][2] is None:
            self._batch[idx][2] = _snapshot(self._batch[idx][1].cond)


def _snapshot(cond: Condition) -> Condition:
    return replace(cond, evidence=dict(cond.evidence))
