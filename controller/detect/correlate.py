"""Conditions become incidents: concurrent findings grouped by what they share on the fabric.

Sixteen NICs down at once on sixteen nodes is one broken leaf, not sixteen broken nodes;
evicting those nodes would be exactly wrong. So every condition waits a short settle
time (its siblings arrive within a report interval or two), then the whole batch is
grouped on the fabric graph and each group becomes one incident with one root cause.

Grouping precedence (each condition joins the first group that claims it; deterministic:
candidates are visited in name order and ties break by name):

1. ``partition`` - heartbeat conditions: at least ``partition_min_nodes`` lost nodes that
   all sit behind one leaf (in a rail-optimized fabric: the same block), or more than
   ``partition_fleet_share`` of the fleet, form ONE incident that blames no node (root
   cause "", component type "network"). Fewer: one ``node_down`` per node.
2. ``switch_fault`` on a spine - the spine's own conditions ("spine-2", "spine-2:Ethernet8")
   and uplink conditions whose far end is that spine (a leaf port whose peer is the spine,
   a leaf<->spine cable): when they implicate at least ``min_leaves_for_spine`` leaves or
   the spine reports itself.
3. ``switch_fault`` on a leaf - host-link conditions (NIC port down/errors, the NIC's
   cable, the leaf's host-facing port) of at least ``min_nodes_for_switch`` distinct nodes
   whose NICs sit on that leaf; the leaf's own conditions join as evidence. Leaf faults on
   several leaves that share exactly one spine (partial meshes) fold into that spine.
4. A switch's own conditions left over: an optic or port condition on a port with a known
   cable is a ``link_fault`` on that cable; anything else (silent, PFC watchdog storm) is a
   ``switch_fault`` on the switch (severity capped at warning when it is only "silent":
   the collector may be what died).
5. Host NIC conditions left over, per NIC: ``link_fault`` on its cable when the switch side
   also reports it (a condition on the cable or on the peer port), else ``nic_fault``.
   ``node_device_threshold`` or more faulty NICs on one node are a ``node_fault``.
6. GPU conditions: ``gpu_fault`` per GPU; ``node_device_threshold`` or more GPUs of one node
   (or a node-level GPU condition such as NVSwitch) are a ``node_fault``.
7. ``straggler`` (fail-slow) and ``host_fault`` (disk, memory) on the node.
8. Anything else: ``other`` on the condition's component.

Eviction rule (self-healing relies on it): only ``EVICTABLE_KINDS`` (gpu_fault, node_fault,
nic_fault, straggler, host_fault) may name a node to evict. Switch, link, partition and
node_down incidents get investigate/check verbs, never an eviction verb.

Lifecycle: opened (after settle) -> updated (members, severity or action changed) ->
resolved (every member condition resolved for ``resolve_hold_s``). Membership is sticky
while an incident is open, so a flapping NIC keeps its incident, and a recurrence soon
after resolution reopens the same incident (same id). When a larger group forms (a leaf
fault over NICs that each had their own incident) the smaller incidents are closed as
merged, pointing at the one that absorbed them: exactly one open incident per fault.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import structlog

from controller.detect.correlation_settings import CorrelationConfig
from controller.detect.fabric_grouping import Group, Grouper, Key, Signature, is_silence
from controller.detect.grouping import ripe_batch, standing_apart
from controller.detect.incidents import IncidentStore
from controller.detect.model import Condition, ConditionChange, Incident
from controller.fabric.model import Fabric
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.core.vocab import SEVERITY_ORDER, Severity

log = structlog.get_logger(__name__)


# Kinds whose action is fixed by the kind, whatever their members recommend.
KIND_ACTIONS: dict[str, str] = {
    "switch_fault": "investigate_switch",
    "partition": "investigate_network",
    "path_fault": "investigate_network",
    "link_fault": vocab.ACTION_CHECK_LINK,
    "straggler": vocab.ACTION_INVESTIGATE,
    "node_down": vocab.ACTION_INVESTIGATE,
    "other": vocab.ACTION_INVESTIGATE,
}
_ACTION_RANK = {a: i for i, a in enumerate(vocab.ACTIONS)}


def _named(evidence: list[dict[str, Any]]) -> tuple[tuple[str, tuple[str, ...], bool], ...]:
    """What a hang's members say about whom to blame (its suspects, whether its stacks are in):
    news an operator and the healer act on, so a change is an incident update."""
    out = []
    for e in evidence:
        ev = e.get("evidence") or {}
        if e.get("category") == "hang":
            out.append((str(e.get("rule", "")), tuple(ev.get("suspect_nodes") or ()), "stacks" in ev))
    return tuple(out)


def summarize(c: Condition) -> dict[str, Any]:
    """A condition as incident evidence; complete enough to rebuild it after a restart."""
    return {
        "rule": c.rule,
        "component": c.component,
        "component_type": c.component_type,
        "category": c.category,
        "node": c.node,
        "severity": c.severity,
        "action": c.action,
        "message": c.message,
        "count": c.count,
        "first_seen_ms": c.first_seen_ms,
        "last_seen_ms": c.last_seen_ms,
        "resolved_ms": c.resolved_ms,
        "evidence": c.evidence,
    }


def _condition_from_summary(d: dict[str, Any], resolved_ms: int) -> Condition | None:
    try:
        return Condition(
            rule=str(d["rule"]),
            component=str(d["component"]),
            component_type=d.get("component_type", "node"),
            category=str(d.get("category", "")),
            node=d.get("node"),
            severity=d.get("severity", "warning"),
            action=str(d.get("action", vocab.ACTION_INVESTIGATE)),
            message=str(d.get("message", "")),
            first_seen_ms=int(d.get("first_seen_ms", 0)),
            last_seen_ms=int(d.get("last_seen_ms", 0)),
            count=int(d.get("count", 1)),
            evidence=dict(d.get("evidence") or {}),
            resolved_ms=resolved_ms,
        )
    except (KeyError, TypeError, ValueError):
        return None


class Correlator:
    """Turns condition changes into incident lifecycle changes, persisted in ``IncidentStore``.

    Single-threaded: call ``on_changes`` with every batch from the condition engine (and
    the fail-slow detector) and ``tick`` periodically (about once a second); ``tick``
    returns what happened to incidents since the last call.
    """

    def __init__(
        self,
        fabric: Fabric | None,
        store: IncidentStore,
        config: CorrelationConfig | None = None,
        jobs_of: Callable[[str], list[str]] = lambda node: [],
        fleet_size: Callable[[], int] | None = None,
        *,
        clock: Clock,
        window_ms: Callable[[Condition], int] | None = None,
        port_clean: Callable[[str, str, int], bool] | None = None,
    ) -> None:
        """``window_ms``: how long a new condition waits for its siblings (controller.detect.grouping);
        None: ``settle_s`` for every condition. ``port_clean``: the switches' own word on their
        ports (controller.detect.switch_witness), so a leaf that reports them clean is not blamed."""
        self.config = config or CorrelationConfig()
        self._window_ms = window_ms or (lambda _c: int(self.config.settle_s * 1000))
        self.store = store
        self.grouper = Grouper(fabric, self.config, fleet_size, port_clean)
        self._jobs_of = jobs_of
        self.clock = clock
        self._clock_ms = clock.time_ms
        self._conds: dict[Key, Condition] = {}
        self._pending: dict[Key, int] = {}  # key -> ms when its grouping window closes, not yet grouped
        # key -> the window (ms) it waited: asked once, so that standing_apart judges a batch by
        # the windows its conditions waited (an event's is shorter than a report's), not a new answer
        self._waited: dict[Key, int] = {}
        self._owner: dict[Key, str] = {}  # key -> open incident id
        self._open: dict[str, Incident] = {}
        self._groups: dict[str, Group] = {}  # open incident id -> the group it was built from
        self._not_before: dict[str, int] = {}  # resumed incidents: no resolution before this
        self._recent: dict[Signature, Incident] = {}  # resolved within the hold: reopen, not duplicate
        self._touched: set[str] = set()
        self._out: list[tuple[str, Incident]] = []
        self._resume()

    @property
    def fabric(self) -> Fabric | None:
        return self.grouper.fabric

    # -- input ---------------------------------------------------------------------------

    def on_changes(self, changes: Iterable[ConditionChange]) -> None:
        """Take condition changes; new conditions wait ``settle_s`` before they are grouped."""
        now = self._clock_ms()
        for ch in changes:
            c = ch.condition
            key = c.key
            self._conds[key] = c
            owner = self._owner.get(key)
            if owner is not None:
                self._touched.add(owner)
            elif ch.kind == "resolved" or not c.active:
                self._pending.pop(key, None)  # a blip shorter than settle_s opens nothing
                self._waited.pop(key, None)
                del self._conds[key]
            elif key not in self._pending:
                self._waited[key] = wait = self._window_ms(c)
                self._pending[key] = now + wait

    def next_due_ms(self) -> int | None:
        """When the first pending condition's grouping window closes (None: nothing waits)."""
        return min(self._pending.values()) if self._pending else None

    def tick(self) -> list[tuple[str, Incident]]:
        """Group settled conditions, refresh and expire incidents; returns (change, incident) pairs."""
        now = self._clock_ms()
        due = ripe_batch(self._pending, self._conds, now)
        if due:
            batch = [k for k in due if self._conds[k].active]
            for k in due:
                del self._pending[k]
                if not self._conds[k].active:
                    del self._conds[k]
            if batch:
                self._regroup(batch, now)
            for k in due:
                self._waited.pop(k, None)
        for iid in sorted(self._touched):
            inc = self._open.get(iid)
            if inc is not None and self._apply(inc, self._groups[iid], now):
                self._emit("updated", inc, {"reason": "member_changed"})
        self._touched.clear()
        self._expire(now)
        hold_ms = int(self.config.resolve_hold_s * 1000)
        for sig in [s for s, i in self._recent.items() if (i.resolved_ms or 0) + hold_ms < now]:
            del self._recent[sig]
        out, self._out = self._out, []
        return out

    # -- queries -------------------------------------------------------------------------

    def incidents(self, active_only: bool = True, limit: int = 100) -> list[Incident]:
        """Open incidents (newest first), or every stored incident when ``active_only`` is False."""
        if active_only:
            newest = sorted(self._open.values(), key=lambda i: (i.opened_ms, i.id), reverse=True)
            return [replace(i) for i in newest[:limit]]
        return self.store.list_incidents(active_only=False, limit=limit)

    def get(self, incident_id: str) -> Incident | None:
        inc = self._open.get(incident_id)
        return replace(inc) if inc is not None else self.store.get(incident_id)

    # -- internals -----------------------------------------------------------------------

    def _resume(self) -> None:
        """Reload open incidents; their conditions count as resolved until raised again."""
        now = self._clock_ms()
        grace_ms = int(self.config.restart_grace_s * 1000)
        for inc in self.store.load_open():
            keys: set[Key] = set()
            for d in inc.evidence:
                c = _condition_from_summary(d, resolved_ms=now) if isinstance(d, dict) else None
                if c is not None:
                    self._conds.setdefault(c.key, c)
                    keys.add(c.key)
            keys.update(k for k in inc.condition_keys if k in self._conds)
            group = Group(inc.kind, inc.root_cause, inc.component_type, members=keys, nodes=set(inc.affected_nodes))
            if inc.kind == "partition":
                group.disc = f"resumed:{inc.id}"
            self._open[inc.id] = inc
            self._groups[inc.id] = group
            self._not_before[inc.id] = now + grace_ms
            for k in keys:
                self._owner[k] = inc.id
        if self._open:
            log.info("incidents_resumed", count=len(self._open))

    def _match(self, g: Group, taken: set[str], by_sig: dict[Signature, str]) -> str | None:
        iid = by_sig.get(g.signature)
        if iid is not None and iid not in taken:
            return iid
        if g.kind == "partition":
            best: tuple[int, str] | None = None
            for iid, og in self._groups.items():
                if iid in taken or og.kind != "partition":
                    continue
                overlap = len(og.members & g.members)
                if overlap and (best is None or (-overlap, iid) < (-best[0], best[1])):
                    best = (overlap, iid)
            if best is not None:
                return best[1]
        return None

    def _waited_ms(self, c: Condition) -> int:
        """The window ``c`` waited before it was grouped (asked now only if it never waited)."""
        waited = self._waited.get(c.key)
        return self._window_ms(c) if waited is None else waited

    def _regroup(self, batch: list[Key], now: int) -> None:
        groups_of = {iid: (g.kind, g.members) for iid, g in self._groups.items() if iid in self._open}
        apart = standing_apart(groups_of, self._conds, batch, self._waited_ms)
        pool = {k for k, iid in self._owner.items() if iid not in apart} | set(batch)
        groups = self.grouper.group(self._conds[k] for k in sorted(pool))
        matched: dict[str, Group] = {iid: self._groups[iid] for iid in apart}  # left as they are
        created: set[str] = set()
        fresh: list[Group] = []
        by_sig = {og.signature: iid for iid, og in sorted(self._groups.items())}
        for g in groups:
            iid = self._match(g, set(matched), by_sig)
            if iid is not None:
                matched[iid] = g
            elif any(self._conds[k].active for k in g.members):
                fresh.append(g)
        for g in fresh:
            inc = self._recent.pop(g.signature, None)
            if inc is not None:
                inc.resolved_ms = None
                self._open[inc.id] = inc
                self._apply(inc, g, now)
                self._emit("opened", inc, {"reason": "reopened", **g.note}, store_change="reopened")
            else:
                inc = Incident(
                    id="",
                    kind=g.kind,
                    root_cause=g.root_cause,
                    component_type=g.component_type,
                    affected_nodes=[],
                    affected_jobs=[],
                    severity="info",
                    action=vocab.ACTION_INVESTIGATE,
                    evidence=[],
                    opened_ms=now,
                )
                self._apply(inc, g, now)
                self.store.open(inc, detail=g.note)
                self._open[inc.id] = inc
                self._out.append(("opened", replace(inc)))
                log.info(
                    "incident_opened",
                    id=inc.id,
                    kind=inc.kind,
                    root_cause=inc.root_cause,
                    severity=inc.severity,
                    nodes=len(inc.affected_nodes),
                    conditions=len(inc.condition_keys),
                )
            matched[inc.id] = g
            created.add(inc.id)
        owner: dict[Key, str] = {}
        for iid, g in matched.items():
            for k in g.members:
                owner[k] = iid
        # Incidents whose conditions all went to other groups were absorbed by a larger fault.
        for iid in sorted(set(self._open) - set(matched)):
            inc = self._open.pop(iid)
            self._groups.pop(iid, None)
            self._not_before.pop(iid, None)
            heirs = Counter(owner[k] for k in inc.condition_keys if k in owner)
            target = min(heirs, key=lambda t: (-heirs[t], t)) if heirs else None
            self.store.resolve(inc, now, merged_into=target)
            self._out.append(("resolved", replace(inc)))
            log.info("incident_merged", id=iid, into=target, kind=inc.kind, root_cause=inc.root_cause)
        for iid, g in sorted(matched.items()):
            inc = self._open[iid]
            self._groups[iid] = g
            if iid not in created and self._apply(inc, g, now):
                self._emit("updated", inc, {"reason": "regrouped", **g.note})
        for k in set(batch) - set(owner):
            self._conds.pop(k, None)
        self._owner = owner

    def _apply(self, inc: Incident, g: Group, now: int) -> bool:
        """Derive an incident's fields from its group; True when something an operator sees changed."""
        conds = [self._conds[k] for k in sorted(g.members) if k in self._conds]
        before = (
            inc.kind,
            inc.root_cause,
            inc.severity,
            inc.action,
            inc.affected_nodes,
            inc.affected_jobs,
            inc.condition_keys,
            _named(inc.evidence),
        )
        inc.kind, inc.root_cause, inc.component_type = g.kind, g.root_cause, g.component_type
        inc.severity = self._severity(g.kind, conds)
        inc.action = KIND_ACTIONS.get(g.kind) or self._member_action(conds)
        inc.affected_nodes = sorted(g.nodes)
        jobs: set[str] = set()
        for n in inc.affected_nodes:
            jobs.update(self._jobs_of(n))
        inc.affected_jobs = sorted(jobs)
        inc.condition_keys = [c.key for c in conds]
        inc.evidence = [summarize(c) for c in conds]
        after = (
            inc.kind,
            inc.root_cause,
            inc.severity,
            inc.action,
            inc.affected_nodes,
            inc.affected_jobs,
            inc.condition_keys,
            _named(inc.evidence),
        )
        if after != before:
            inc.updated_ms = now
            return True
        return False

    @staticmethod
    def _severity(kind: str, conds: list[Condition]) -> Severity:
        if kind == "partition":
            return "critical"
        if not conds:
            return "warning"
        sev = max((c.severity for c in conds), key=lambda s: SEVERITY_ORDER.get(s, 0))
        if kind == "switch_fault" and all(is_silence(c) for c in conds) and SEVERITY_ORDER[sev] > 1:
            return "warning"  # a silent switch alone may just be a dead collector
        return sev

    @staticmethod
    def _member_action(conds: list[Condition]) -> str:
        if not conds:
            return vocab.ACTION_INVESTIGATE
        top = max(
            conds,
            key=lambda c: (
                c.active,
                SEVERITY_ORDER.get(c.severity, 0),
                _ACTION_RANK.get(c.action, _ACTION_RANK[vocab.ACTION_INVESTIGATE]),
            ),
        )
        return top.action or vocab.ACTION_INVESTIGATE

    def _emit(self, change: str, inc: Incident, detail: dict[str, Any], store_change: str | None = None) -> None:
        self.store.update(inc, change=store_change or change, detail=detail)
        self._out.append((change, replace(inc)))
        log.info(
            f"incident_{store_change or change}",
            id=inc.id,
            kind=inc.kind,
            root_cause=inc.root_cause,
            severity=inc.severity,
            nodes=len(inc.affected_nodes),
            conditions=len(inc.condition_keys),
        )

    def _expire(self, now: int) -> None:
        """Resolve incidents whose conditions all stayed resolved for the hold time."""
        hold_ms = int(self.config.resolve_hold_s * 1000)
        for iid in sorted(self._open):
            inc = self._open[iid]
            conds = [self._conds[k] for k in inc.condition_keys if k in self._conds]
            if any(c.active for c in conds):
                continue
            quiet_since = max((c.resolved_ms or now for c in conds), default=now)
            if now - quiet_since < hold_ms or now < self._not_before.get(iid, 0):
                continue
            self._close(iid, now, None)

    def _close(self, iid: str, now: int, detail: dict[str, Any] | None) -> Incident:
        inc = self._open.pop(iid)
        group = self._groups.pop(iid)
        self._not_before.pop(iid, None)
        for k in inc.condition_keys:
            if self._owner.get(k) == iid:
                del self._owner[k]
                if k not in self._pending:
                    self._conds.pop(k, None)
        self.store.resolve(inc, now, detail=detail)
        self._recent[group.signature] = inc
        self._out.append(("resolved", replace(inc)))
        log.info(
            "incident_resolved",
            id=iid,
            kind=inc.kind,
            root_cause=inc.root_cause,
            open_ms=now - inc.opened_ms,
            **(detail or {}),
        )
        return inc

    def conditions_clear(self, incident_id: str, since_ms: int | None = None) -> bool:
        """Every condition of the open incident has resolved, or (``since_ms``) was not seen since
        then (False for an unknown or closed one).

        Why ``since_ms``: an Xid is an event, and its condition stays active for its rule's
        window after the last one (30-60 minutes); after a GPU reset the question is whether
        the Xid came again, not whether the window has run out.
        """
        inc = self._open.get(incident_id)
        if inc is None:
            return False
        return not any(
            c.active and (since_ms is None or c.last_seen_ms >= since_ms)
            for c in (self._conds[k] for k in inc.condition_keys if k in self._conds)
        )

    def resolve_on_evidence(
        self, incident_id: str, reason: str, actor: str, since_ms: int | None = None
    ) -> Incident | None:
        """Close an open incident now, without the hold: its node was repaired and proven healthy,
        or a person says it is over. Refused (None) while a condition of it is still active
        (seen since ``since_ms``), unless a person asks. Listeners (the webhook says why) hear
        it on the next tick."""
        inc = self._open.get(incident_id)
        if inc is None:
            return None
        if actor == "starpulse" and not self.conditions_clear(incident_id, since_ms):
            return None
        return replace(self._close(incident_id, self._clock_ms(), {"reason": reason, "by": actor}))
