"""The condition engine: events, reports and presence in; opened/updated/resolved conditions out.

A condition is keyed (rule, component), so a storm is one condition with a count: 10,000
identical Xids are one condition, count 10,000, announced once and then updated at most
once per ``update_interval`` (the rest is folded into the next update or ``tick``).

Two lifecycles:

- event-driven (kind ``event``): active until ``hold`` passes without a new event, or,
  for counted events (``min_count`` in a ``window``), until the window empties;
- state-driven (every report kind): active while reports show the bad state, resolved
  after ``resolve_after`` reports in a row show the good one. A state rule may also be
  opened early by an event (``events:``); if no report ever confirms it, it expires
  after ``hold`` like an event.

Components are fabric names ("node-003/gpu-5", "node-003/nic-5", "leaf-b0-r3:Ethernet8"
or, when the fabric knows the cable, "node-003/nic-5<->leaf-b0-r3"). ``on_report`` runs
for every report, so it does dict lookups and arithmetic only; messages and evidence are
built just for components in a bad state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import structlog

from controller.detect.linkkey import links_key
from controller.detect.model import ComponentType, Condition, ConditionChange, ConditionChangeKind
from controller.detect.nvlinks import Links, from_rows, overlay
from controller.detect.rates import CounterRate, RateSample
from controller.detect.rules import CLOCK_REASON_BITS, Rule, RuleSet
from controller.fabric import Fabric
from controller.fabric.naming import NicNamer, gpu_name, switch_port_name
from controller.ingest.registry import NodeRecord
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.core.findings import event_kind_name
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

ONLINE = "online"
UNREACHABLE = "unreachable"

_Key = tuple[str, str]

_GPU_EVENTS = frozenset(
    {
        tpb.EVENT_KIND_XID,
        tpb.EVENT_KIND_ECC_DBE,
        tpb.EVENT_KIND_GPU_LOST,
        tpb.EVENT_KIND_GPU_RESET_REQUIRED,
        tpb.EVENT_KIND_GPU_RECOVERY_ACTION,
        tpb.EVENT_KIND_ROW_REMAP_FAILURE,
        tpb.EVENT_KIND_NVLINK_DOWN,
        tpb.EVENT_KIND_THERMAL_SLOWDOWN,
    }
)
_NIC_EVENTS = frozenset({tpb.EVENT_KIND_NIC_LINK_DOWN, tpb.EVENT_KIND_NIC_LINK_UP, tpb.EVENT_KIND_NIC_DRIVER_ERROR})
_PORT_EVENTS = frozenset({tpb.EVENT_KIND_SWITCH_PORT_DOWN, tpb.EVENT_KIND_SWITCH_PORT_UP, tpb.EVENT_KIND_PFC_STORM})
_EVENT_SEVERITY = {
    tpb.SEVERITY_UNSPECIFIED: 1,  # unknown: treat as a warning, never as 'restored'
    tpb.SEVERITY_INFO: 0,
    tpb.SEVERITY_WARNING: 1,
    tpb.SEVERITY_CRITICAL: 2,
    tpb.SEVERITY_FATAL: 3,
}
_PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_OPTIONAL_FLAGS = frozenset({"remap_pending", "remap_failure", "retired_pages_pending"})
_MAX_EVENT_WINDOW = 4096
_MAX_CACHED_PORTS = 256  # per node: a report names at most MAX_NICS ports; a stranger is named per report
_SWITCH = ipb.NODE_ROLE_SWITCH


@dataclass(slots=True)
class _Entry:
    """Engine bookkeeping around one active condition."""

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


@dataclass(slots=True)
class _NodeCtx:
    """Per-node naming, rebuilt when the agent re-registers (new inventory) or LLDP changes."""

    token: int
    lldp_id: int
    namer: NicNamer
    gpu_by_pci: dict[str, int]
    nic_by_pci: dict[str, str]
    gpu_indices: frozenset[int]
    gpu_comp: dict[int, str]  # inventory GPU index -> "node/gpu-<i>", built once, not per report
    # (rdma_device, port) -> ("dev/port", component name, on a rail): the NIC naming of every report
    nic_ports: dict[tuple[str, int], tuple[str, str, bool]]


class ConditionEngine:
    """Applies a RuleSet to what agents send; keeps the active conditions.

    Not thread-safe: call it from the controller's event loop, as the registry does.
    Changes returned carry snapshots; ``active()`` returns the live conditions (read only).
    """

    def __init__(
        self,
        rules: RuleSet,
        fabric: Fabric | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rates: CounterRate | None = None,
    ) -> None:
        self.rules = rules
        self.fabric = fabric
        self.clock = clock
        self._clock = clock.time_ms
        longest = max((r.window_s for r in rules.rules), default=0.0)
        self.rates = rates or CounterRate(retain_s=max(longest, rules.defaults.flap_window_s) + 60.0)
        self._update_ms = int(rules.defaults.update_interval_s * 1000)
        self._saturated_fires = rules.defaults.saturated_fires
        self._active: dict[_Key, _Entry] = {}
        self._by_owner: dict[str, dict[_Key, _Entry]] = {}
        self._held: dict[_Key, _Entry] = {}  # resolve on hold expiry
        self._windowed: dict[_Key, _Entry] = {}  # resolve when their window empties
        self._dirty: dict[_Key, _Entry] = {}  # updates deferred by the rate limit
        self._event_windows: dict[tuple[str, str, str], deque[tuple[int, int]]] = {}
        self._ctx: dict[str, _NodeCtx] = {}
        self._batch: list[list[Any]] = []  # [kind, entry, snapshot | None]
        self._batch_idx: dict[_Key, int] = {}
        k = rules.by_kind
        self._gpu_flag = k["gpu_flag"]
        # (rule, field, optional): an optional flag that is absent is neither bad nor good
        self._gpu_flag_spec = tuple((r, f, f in _OPTIONAL_FLAGS) for r in self._gpu_flag for f in [r.params["field"]])
        self._gpu_recovery = k["gpu_recovery_action"]
        self._gpu_clock = [(r, _mask(r)) for r in k["gpu_clock_reasons"]]
        # What the per-GPU state rules look at, in one C-level read: when every flag is false,
        # recovery_action is 0, no watched clock reason is set and nothing is open on the node,
        # none of those rules can say anything (the common, healthy GPU).
        self._gpu_read = attrgetter(
            *[f for _, f, _ in self._gpu_flag_spec], "lost", "recovery_action", "clock_event_reasons"
        )
        self._clock_watched = 0
        for _, mask in self._gpu_clock:
            self._clock_watched |= mask
        self._gpu_missing = k["gpu_missing"]
        self._nvlink_down = k["gpu_nvlink_down"]
        self._nvlink_errors = k["gpu_nvlink_errors"]
        self._nvlink_counters = tuple(dict.fromkeys(c for r in self._nvlink_errors for c in r.counter_keys))
        # One C-level read of one link: (link, up, *watched counters).
        self._nvlink_row = attrgetter("link", "up", *self._nvlink_counters)
        self._has_link_rules = bool(self._nvlink_down or self._nvlink_errors)
        self._nic_state = [(r, _PORT_STATES.get(str(r.params["expect"]).upper(), 4)) for r in k["nic_state"]]
        self._nic_read = attrgetter("rdma_device", "port", "state_code", "rate_gbps")
        self._nic_counter = k["nic_counter"]
        # Every (source, counter, key) any nic_counter rule reads: each is updated once per report.
        reads = dict.fromkeys((r.params["source"], c) for r in k["nic_counter"] for c in r.params["counters"])
        sources: dict[str, list[str]] = {}
        for source, counter in reads:
            sources.setdefault(source, []).append(counter)
        self._nic_sources = tuple((src, tuple(cs)) for src, cs in sources.items())
        self._nic_names = tuple(f"{src}/{c}" for src, cs in self._nic_sources for c in cs)
        self._nic_watched = tuple(frozenset(cs) for _, cs in self._nic_sources)
        # The counter maps those reads come from, in one C-level read (always a tuple)
        self._nic_maps = _tuple_getter(*(src for src, _ in self._nic_sources))
        self._nvlink_names: dict[int, tuple[str, ...]] = {}  # link count -> "nvlink-<pos>/<counter>" names
        self._counter_ms = int(rules.defaults.counter_interval_s * 1000)
        self._sampled: dict[str, int] = {}  # counter entity -> controller time of its last read
        # GPU -> its links in its last full report: in a delta report an absent link is as there
        # (agent.transport.delta), whether or not that report's counters were read.
        self._link_base: dict[str, Links] = {}
        # GPU -> the link counter values of its last NVLink counter read (often the base's own tuple)
        self._link_read: dict[str, tuple[int, ...]] = {}
        # NIC counters of each port's last full report: in a delta report an absent counter
        # has that value (agent.transport.delta), whether or not that report was read.
        self._nic_base: dict[str, tuple[int | None, ...]] = {}
        self._nic_rate = k["nic_rate"]
        self._port_state = k["switch_port_state"]
        self._pfc_wd = k["switch_pfc_watchdog"]
        self._optics = k["switch_optics"]
        self._disk = k["host_disk"]
        self._memory = k["host_memory"]
        self._heartbeat = k["heartbeat"]
        self._switch_silent = k["switch_silent"]
        self._has_gpu_rules = bool(
            self._gpu_flag or self._gpu_recovery or self._gpu_clock or self._nvlink_down or self._nvlink_errors
        )
        self._has_nic_rules = bool(self._nic_state or self._nic_counter or self._nic_rate)

    # -- public API ------------------------------------------------------------------------

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> list[ConditionChange]:
        """Apply a batch of new events from one node."""
        now = self._clock()
        rules = self.rules
        for ev in events:
            kind = ev.kind
            for rule in rules.resolving_event.get(kind, ()):
                comp, _, _ = self._event_component(node, ev)
                entry = self._active.get((rule.id, comp))
                if entry is not None:
                    self._resolve(entry, now, reason=event_kind_name(kind))
            matched = rules.event_rules(kind, ev.xid)
            if not matched:
                continue
            sev = _EVENT_SEVERITY.get(ev.severity, 0)
            comp, ctype, owner_node = self._event_component(node, ev)
            n = _occurrences(ev)
            for rule in matched:
                if rule.kind == "event":
                    floor = rule.params.get("min_event_severity")
                    if floor is not None and sev < SEVERITY_ORDER[floor]:
                        continue
                    self._on_event_rule(rule, node.node_id, comp, ctype, owner_node, ev, n, now)
                elif sev > 0:  # a state rule opened early; info events (restored, admin down) never open
                    self._on_state_event(rule, node.node_id, comp, ctype, owner_node, ev, n, now)
        return self._flush()

    def on_report(self, node: NodeRecord, report: tpb.Report) -> list[ConditionChange]:
        """Evaluate every report-driven rule against one report."""
        now = self._clock()
        ts = report.timestamp_ms or now
        nid = node.node_id
        if node.role == _SWITCH:
            if report.switch_ports:
                self._switch_ports(nid, report.switch_ports, now)
            return self._flush()
        ctx = self._node_ctx(node)
        gpus = report.gpus  # each repeated field is read once per report
        if gpus or self._gpu_missing:
            seen: list[int] | None = None
            if self._has_gpu_rules:
                seen = []
                comps = ctx.gpu_comp
                delta = report.counters_delta
                for g in gpus:
                    index = g.index
                    seen.append(index)
                    self._gpu(nid, comps.get(index) or gpu_name(nid, f"gpu-{index}"), g, ts, now, delta)
            if self._gpu_missing:
                self._gpus_missing(nid, ctx, report, gpus, seen, now)
        if self._has_nic_rules:
            nics = report.nics
            if nics:
                self._nics(nid, ctx, nics, ts, now, report.counters_delta)
        if report.HasField("host"):
            self._host(nid, report.host, now)
        if report.switch_ports:  # a compute node does not report switch ports; tolerate it
            self._switch_ports(nid, report.switch_ports, now)
        return self._flush()

    def on_presence(self, node: NodeRecord, old: str, new: str) -> list[ConditionChange]:
        """Heartbeat (compute) or switch-silent (switch) conditions from presence changes."""
        now = self._clock()
        is_switch = node.role == _SWITCH
        rules = self._switch_silent if is_switch else self._heartbeat
        nid = node.node_id
        ctype: ComponentType = "switch" if is_switch else "node"
        for rule in rules:
            key = (rule.id, nid)
            if new == UNREACHABLE:
                silent_s = round((now - node.last_seen_ms) / 1000, 1) if node.last_seen_ms else None
                msg = f"{nid} not heard from" + (f" for {silent_s}s" if silent_s is not None else "")
                self._bad(
                    rule,
                    nid,
                    ctype,
                    None if is_switch else nid,
                    nid,
                    msg,
                    {"previous_state": old, "last_seen_ms": node.last_seen_ms, "silent_s": silent_s},
                    now,
                    confirmed=True,
                )
            elif new == ONLINE:
                entry = self._active.get(key)
                if entry is not None:
                    self._resolve(entry, now, reason="online")
        return self._flush()

    def tick(self) -> list[ConditionChange]:
        """Time-driven work: hold expiry, emptied windows, deferred updates. Call about once a second."""
        now = self._clock()
        for entry in list(self._held.values()):
            if now - entry.touched_ms >= entry.rule.hold_ms:
                self._resolve(entry, now, reason="hold_expired")
        for key, entry in list(self._windowed.items()):
            if key not in self._active:
                continue
            if not self._window_count(entry, now):
                self._resolve(entry, now, reason="window_empty")
        for entry in list(self._dirty.values()):
            if entry.cond.key in self._active and now - entry.emitted_ms >= self._update_ms:
                self._emit("updated", entry, now)
        return self._flush()

    def active(self) -> list[Condition]:
        """The active conditions (live objects: do not mutate)."""
        return [e.cond for e in self._active.values()]

    def get(self, rule: str, component: str) -> Condition | None:
        entry = self._active.get((rule, component))
        return None if entry is None else entry.cond

    def forget(self, node_id: str) -> list[ConditionChange]:
        """A node left: resolve what its data drives and drop its counters, windows and naming."""
        now = self._clock()
        for entry in list(self._by_owner.get(node_id, {}).values()):
            self._resolve(entry, now, reason="forgotten")
        self._by_owner.pop(node_id, None)
        self._ctx.pop(node_id, None)
        for wkey in [w for w in self._event_windows if w[0] == node_id]:
            del self._event_windows[wkey]
        for entity in [e for e in self._sampled if e == node_id or e.startswith((f"{node_id}/", f"{node_id}:"))]:
            del self._sampled[entity]
        for links in (self._link_base, self._link_read):
            for entity in [e for e in links if e.startswith(f"{node_id}/")]:
                del links[entity]
        for entity in [e for e in self._nic_base if e.startswith((f"{node_id}/", f"{node_id}:"))]:
            del self._nic_base[entity]
        dropped = self.rates.forget(node_id)
        log.info("condition_node_forgotten", node=node_id, counters_dropped=dropped)
        return self._flush()

    # -- events ----------------------------------------------------------------------------

    def _on_event_rule(
        self,
        rule: Rule,
        owner: str,
        comp: str,
        ctype: ComponentType,
        node: str | None,
        ev: tpb.Event,
        n: int,
        now: int,
    ) -> None:
        min_count = rule.params.get("min_count", 1)
        key = (rule.id, comp)
        entry = self._active.get(key)
        if min_count > 1:
            count = self._count_event(rule, owner, comp, n, now)
            if entry is None and count < min_count:
                return
            if entry is None:
                window_s = rule.window_s
                msg = f"{comp}: {count} {event_kind_name(ev.kind)} events in {window_s:g}s (threshold {min_count})"
                entry = self._open(rule, comp, ctype, node, owner, msg, self._event_evidence(ev, count), now, count)
                entry.confirmed = True
                self._windowed[key] = entry
                return
        if entry is None:
            entry = self._open(
                rule, comp, ctype, node, owner, self._event_message(rule, comp, ev), self._event_evidence(ev, n), now, n
            )
            self._held[key] = entry
            return
        entry.cond.count += n
        entry.cond.last_seen_ms = now
        entry.touched_ms = now
        entry.cond.evidence["last_event_ts_ms"] = ev.timestamp_ms
        self._repeat(entry, now)

    def _on_state_event(
        self,
        rule: Rule,
        owner: str,
        comp: str,
        ctype: ComponentType,
        node: str | None,
        ev: tpb.Event,
        n: int,
        now: int,
    ) -> None:
        key = (rule.id, comp)
        entry = self._active.get(key)
        if entry is None:
            entry = self._open(
                rule, comp, ctype, node, owner, self._event_message(rule, comp, ev), self._event_evidence(ev, n), now, n
            )
            if rule.kind == "gpu_recovery_action":
                value = int(ev.attributes.get("recovery_action", "0") or 0)
                if value:
                    self._set_recovery(entry, value)
            self._held[key] = entry  # until a report confirms it
            return
        entry.cond.count += n
        entry.cond.last_seen_ms = now
        entry.touched_ms = now
        entry.good = 0
        self._repeat(entry, now)

    def _count_event(self, rule: Rule, owner: str, comp: str, n: int, now: int) -> int:
        wkey = (owner, rule.id, comp)
        win = self._event_windows.get(wkey)
        if win is None:
            win = self._event_windows[wkey] = deque(maxlen=_MAX_EVENT_WINDOW)
        win.append((now, n))
        horizon = now - int(rule.window_s * 1000)
        while win and win[0][0] <= horizon:
            win.popleft()
        return sum(c for _, c in win)

    def _event_message(self, rule: Rule, comp: str, ev: tpb.Event) -> str:
        if ev.kind == tpb.EVENT_KIND_XID and ev.xid:
            info = xidcat.lookup(ev.xid)
            return f"{comp}: Xid {ev.xid} ({info.mnemonic}): {info.description}"
        return f"{comp}: {ev.message or event_kind_name(ev.kind)}"

    @staticmethod
    def _event_evidence(ev: tpb.Event, count: int) -> dict[str, Any]:
        evidence: dict[str, Any] = {
            "event": event_kind_name(ev.kind),
            "agent_component": ev.component,
            "source": ev.source,
            "first_event_ts_ms": ev.timestamp_ms,
            "last_event_ts_ms": ev.timestamp_ms,
            "count": count,
        }
        if ev.xid:
            evidence["xid"] = ev.xid
            if ev.kind == tpb.EVENT_KIND_XID:
                info = xidcat.lookup(ev.xid)
                evidence["mnemonic"] = info.mnemonic
                evidence["catalog_bucket"] = info.immediate
        if ev.action:
            evidence["agent_action"] = ev.action
        if ev.attributes:
            evidence["attributes"] = dict(ev.attributes)
        return evidence

    def _event_component(self, node: NodeRecord, ev: tpb.Event) -> tuple[str, ComponentType, str | None]:
        """(fabric name, type, compute node) of an event's component."""
        nid = node.node_id
        kind = ev.kind
        comp = ev.component
        if node.role == _SWITCH:
            if kind in _PORT_EVENTS and comp:
                name, ctype, _ = self._port_component(nid, comp)
                return name, ctype, None
            return nid, "switch", None
        if kind in _GPU_EVENTS:
            ctx = self._node_ctx(node)
            if comp.startswith("gpu@") or (comp in ("", "gpu") and ev.pci):
                index = ctx.gpu_by_pci.get(vocab.pci_key(ev.pci or comp[4:]))
                if index is not None:
                    return gpu_name(nid, f"gpu-{index}"), "gpu", nid
            return gpu_name(nid, comp or "gpu"), "gpu", nid
        if kind in _NIC_EVENTS:
            ctx = self._node_ctx(node)
            nic = ctx.namer.nic(comp) if comp else None
            if nic is None and ev.pci:
                nic = ctx.nic_by_pci.get(vocab.pci_key(ev.pci))
            if nic is not None:
                return nic, "nic", nid
        return nid, "node", nid

    # -- reports: GPU ----------------------------------------------------------------------

    def _gpu(self, nid: str, comp: str, g: tpb.GpuSample, ts: int, now: int, delta: bool = False) -> None:
        """Every per-GPU rule; a healthy GPU with nothing open costs one read of its state fields
        (and, in a full report, one links_key; in a delta report its links cost nothing)."""
        owned = self._by_owner.get(nid)
        state = self._gpu_read(g)
        if (owned or any(state[:-1]) or state[-1] & self._clock_watched) and not self._gpu_state(
            nid, comp, g, now, owned
        ):
            return  # a lost GPU: nothing else was readable
        if not self._has_link_rules:
            return
        links = g.nvlinks
        # a delta report's GPU without links: exactly the base (no call, no link read)
        view = self._link_base.get(comp) if delta and not links else self._links(comp, g, links, delta)
        if view is None:
            return
        if self._nvlink_down:
            down = view.down
            if not down:
                if owned:
                    for rule in self._nvlink_down:
                        self._good(owned, rule, comp, now)
            else:
                for rule in self._nvlink_down:
                    self._bad(
                        rule,
                        comp,
                        "gpu",
                        nid,
                        nid,
                        f"{comp}: NVLink {', '.join(map(str, down))} down",
                        {"links_down": list(down), "links": len(view.numbers)},
                        now,
                    )
        if self._nvlink_errors:
            last = self._sampled.get(comp)  # _due, inline: most reports do not read the counters
            if last is None or now - last >= self._counter_ms:
                self._sampled[comp] = now
                self._nvlink_rates(nid, comp, view, ts, now, owned)

    def _links(self, comp: str, g: tpb.GpuSample, links: Any, delta: bool) -> Links | None:
        """The GPU's links as of this report (None: it has none).

        A full report's become the base, read only when they differ from the last full
        report's (links_key: ~6 us a GPU, in C); a delta report's links are laid over the
        base, and a delta that carries none is the base itself (no link is read)."""
        base = self._link_base.get(comp)
        if delta and base is not None:
            if not links:
                return base
            rows = list(map(self._nvlink_row, links))
            # None: a link the base lacks; only an agent from before NVLink deltas sends a link
            # set other than the full report's, and it sends every link: take them as they are.
            return overlay(base, rows) or from_rows(b"", rows, len(self._nvlink_counters))
        if not links:
            if not delta:
                self._link_base.pop(comp, None)
            return None
        if delta:  # no full report seen on this stream yet: what is there is all there is
            return from_rows(b"", list(map(self._nvlink_row, links)), len(self._nvlink_counters))
        key = links_key(g)
        if base is not None and base.key == key:
            return base  # the same records as the last full report: nothing to read again
        base = from_rows(key, list(map(self._nvlink_row, links)), len(self._nvlink_counters))
        self._link_base[comp] = base
        return base

    def _gpu_state(self, nid: str, comp: str, g: tpb.GpuSample, now: int, owned: dict[_Key, _Entry] | None) -> bool:
        """Flags, recovery action and clock reasons; False for a lost GPU (stop there).

        Each field is read once; presence (HasField) is asked only where it decides something:
        a set flag or a non-zero value is present by definition, so the question is left for
        the GPU that has an open condition to resolve."""
        for rule, fld, optional in self._gpu_flag_spec:
            if getattr(g, fld):
                self._bad(
                    rule, comp, "gpu", nid, nid, f"{comp}: {rule.description}", {"field": fld, "uuid": g.uuid}, now
                )
            elif owned and (not optional or g.HasField(fld)):
                self._good(owned, rule, comp, now)
        if g.lost:
            return False  # nothing else was readable: neither bad nor good
        if self._gpu_recovery:
            value = g.recovery_action
            if value:
                name, action = xidcat.recovery_action(value)
                for rule in self._gpu_recovery:
                    self._bad(
                        rule,
                        comp,
                        "gpu",
                        nid,
                        nid,
                        f"{comp}: driver recovery action {value} ({name})",
                        {"recovery_action": value, "recovery_action_name": name, "uuid": g.uuid},
                        now,
                        action=action,
                        severity=_recovery_severity(rule, action),
                    )
            elif owned and g.HasField("recovery_action"):
                for rule in self._gpu_recovery:
                    self._good(owned, rule, comp, now)
        if self._gpu_clock:
            reasons = g.clock_event_reasons
            for rule, mask in self._gpu_clock:
                bits = reasons & mask
                if bits:
                    names = [n for n, _ in _reason_names(bits)]
                    self._bad(
                        rule,
                        comp,
                        "gpu",
                        nid,
                        nid,
                        f"{comp}: hardware clock slowdown ({', '.join(names)})",
                        {
                            "clock_event_reasons": hex(reasons),
                            "reasons": names,
                            "temperature_c": g.temperature_c if g.HasField("temperature_c") else None,
                            "power_w": g.power_w if g.HasField("power_w") else None,
                        },
                        now,
                    )
                elif owned and g.HasField("clock_event_reasons"):
                    self._good(owned, rule, comp, now)
        return True

    def _due(self, entity: str, now: int) -> bool:
        """Whether an entity's cumulative counters should be read now (see defaults.counter_interval)."""
        last = self._sampled.get(entity)
        if last is not None and now - last < self._counter_ms:
            return False
        self._sampled[entity] = now
        return True

    def _nvlink_rates(
        self, nid: str, comp: str, view: Links, ts: int, now: int, owned: dict[_Key, _Entry] | None
    ) -> None:
        """The NVLink error rules, when the counters are due (the caller checks and stamps
        counter_interval); counters equal to the last read's (the common case: the same
        tuple, the base's) are not handed to the rates again."""
        counters = self._nvlink_counters
        numbers = view.numbers
        names = self._nvlink_names.get(len(numbers))
        if names is None:
            names = self._nvlink_names[len(numbers)] = tuple(
                f"nvlink-{pos}/{c}" for pos in range(len(numbers)) for c in counters
            )
        values = view.values
        last = self._link_read.get(comp)
        self._link_read[comp] = values
        samples: Mapping[str, RateSample] | None
        if (last is values or last == values) and self.rates.unchanged(comp, ts, names):
            samples = None  # what update_group answers for the values it already holds
        else:
            samples = self.rates.update_group(comp, ts, names, values, now)
        if samples is None and not (owned and any((r.id, comp) in owned for r in self._nvlink_errors)):
            return  # nothing moved and nothing open: no verdict can change
        for rule in self._nvlink_errors:
            worst: tuple[float, bool, int, str] | None = None
            keys: list[str] = []
            for pos, link in enumerate(numbers):
                for counter in rule.counter_keys:
                    key = f"nvlink-{pos}/{counter}"
                    keys.append(key)
                    measured = self._measure(rule, comp, key, samples.get(key) if samples else None, now)
                    if measured is not None and (worst is None or _worse(measured, worst)):
                        worst = (measured[0], measured[1], link, counter)
            key_ = (rule.id, comp)
            if worst is not None and self._exceeds(rule, worst[0], worst[1]):
                value, saturated, link, counter = worst
                entry = self._bad(
                    rule,
                    comp,
                    "gpu",
                    nid,
                    nid,
                    _threshold_message(rule, f"{comp} NVLink {link} {counter}", value, saturated),
                    _threshold_evidence(rule, counter, value, saturated, link=link),
                    now,
                )
                if not rule.threshold_is_rate:
                    entry.entity, entry.counters = comp, tuple(keys)
                    self._windowed[key_] = entry
            elif owned and key_ in owned and rule.threshold_is_rate:
                self._good(owned, rule, comp, now)

    def _gpus_missing(
        self, nid: str, ctx: _NodeCtx, report: tpb.Report, gpus: Any, indices: list[int] | None, now: int
    ) -> None:
        if not ctx.gpu_indices:
            return
        seen = set(indices) if indices is not None else {g.index for g in gpus}
        owned = self._by_owner.get(nid)
        if not owned and ctx.gpu_indices <= seen:
            return  # every GPU reported and nothing open to resolve: no verdict can change
        gpu_status = next((c for c in report.collectors if c.name == "gpu"), None)
        if gpu_status is not None and not gpu_status.ok:
            return  # the collector failed: absent GPUs are unknown, not missing
        if not gpus and gpu_status is None:
            return
        for rule in self._gpu_missing:
            for index in ctx.gpu_indices:
                comp = ctx.gpu_comp[index]
                if index not in seen:
                    self._bad(
                        rule,
                        comp,
                        "gpu",
                        nid,
                        nid,
                        f"{comp}: in the inventory but not in the report ({len(seen)} of {len(ctx.gpu_indices)} GPUs)",
                        {"reported_gpus": len(seen), "inventory_gpus": len(ctx.gpu_indices)},
                        now,
                    )
                elif owned:
                    self._good(owned, rule, comp, now)

    # -- reports: NIC ----------------------------------------------------------------------

    def _nics(
        self, nid: str, ctx: _NodeCtx, nics: Iterable[tpb.NicSample], ts: int, now: int, delta: bool = False
    ) -> None:
        owned = self._by_owner.get(nid)
        rails: list[tuple[str, tpb.NicSample, int, float]] = []
        ports = ctx.nic_ports
        want_rate = bool(self._nic_rate)
        read = self._nic_read
        sampled = self._sampled
        counter_ms = self._counter_ms
        for s in nics:
            dev, num, code, rate = read(s)
            port = (dev, num)
            named = ports.get(port)
            if named is None:
                local = f"{dev}/{num}"
                name = ctx.namer.nic(local)
                named = (local, name or f"{nid}/{local}", name is not None)
                if len(ports) < _MAX_CACHED_PORTS:
                    ports[port] = named
            local, comp, on_rail = named
            if on_rail and want_rate:
                rails.append((comp, s, code, rate))
            if code:  # 0: the state was not read, neither bad nor good
                for rule, expect in self._nic_state:
                    if code != expect:
                        self._bad(
                            rule,
                            comp,
                            "nic",
                            nid,
                            nid,
                            f"{comp} ({local}) is {s.state or code} / {s.phys_state}",
                            self._nic_evidence(
                                comp,
                                s,
                                state=s.state,
                                state_code=code,
                                phys_state=s.phys_state,
                                operstate=s.netdev_operstate,
                            ),
                            now,
                        )
                    elif owned:
                        self._good(owned, rule, comp, now)
            if self._nic_counter:
                if delta:  # _due, inline: a delta report's counters are read only every counter_interval
                    last = sampled.get(comp)
                    if last is not None and now - last < counter_ms:
                        continue
                self._nic_counters(nid, comp, s, ts, now, owned, delta)
        if self._nic_rate and rails:
            self._nic_rates(nid, rails, now, owned)

    def _nic_counters(
        self,
        nid: str,
        comp: str,
        s: tpb.NicSample,
        ts: int,
        now: int,
        owned: dict[_Key, _Entry] | None,
        delta: bool = False,
    ) -> None:
        if delta:
            if not self._due(comp, now):
                return
            base = self._nic_base.get(comp)
            if base is not None and self._nic_untouched(s):
                values = base  # what the merge below gives when no watched counter is in the delta
            else:
                values = self._nic_values(s)
                if base is not None and None in values:
                    values = tuple([b if v is None else v for v, b in zip(values, base, strict=True)])
        else:
            values = self._nic_values(s)
            self._nic_base[comp] = values  # every full report: the base later deltas omit
            if not self._due(comp, now):
                return
        samples = self.rates.update_group(comp, ts, self._nic_names, values, now)
        if samples is None and not (owned and any((r.id, comp) in owned for r in self._nic_counter)):
            return  # nothing moved and nothing open: no verdict can change
        for rule in self._nic_counter:
            worst: tuple[float, bool, str] | None = None
            for key in rule.counter_keys:
                measured = self._measure(rule, comp, key, samples.get(key) if samples else None, now)
                if measured is not None and (worst is None or _worse(measured, worst)):
                    worst = (measured[0], measured[1], key)
            key_ = (rule.id, comp)
            if worst is not None and self._exceeds(rule, worst[0], worst[1]):
                value, saturated, counter = worst
                entry = self._bad(
                    rule,
                    comp,
                    "nic",
                    nid,
                    nid,
                    _threshold_message(rule, f"{comp} {counter}", value, saturated),
                    self._nic_evidence(comp, s, **_threshold_evidence(rule, counter, value, saturated)),
                    now,
                )
                if not rule.threshold_is_rate:
                    entry.entity, entry.counters = comp, rule.counter_keys
                    self._windowed[key_] = entry
            elif owned and key_ in owned and rule.threshold_is_rate:
                self._good(owned, rule, comp, now)
            # count rules resolve when their window empties (tick), not on one quiet report

    def _nic_untouched(self, s: tpb.NicSample) -> bool:
        """True when a delta report carries none of the counters the rules read for this port.

        A healthy port's delta holds only its traffic counters, so this is the common case:
        one C-level key scan per map instead of a lookup per watched counter.
        """
        for m, watched in zip(self._nic_maps(s), self._nic_watched, strict=True):
            if m and not watched.isdisjoint(m):
                return False
        return True

    def _nic_values(self, s: tpb.NicSample) -> tuple[int | None, ...]:
        values: list[int | None] = []
        for m, (_, counters) in zip(self._nic_maps(s), self._nic_sources, strict=True):
            values.extend(map(m.get, counters))
        return tuple(values)

    def _nic_rates(
        self,
        nid: str,
        rails: list[tuple[str, tpb.NicSample, int, float]],
        now: int,
        owned: dict[_Key, _Entry] | None,
    ) -> None:
        top = max((rate for _, _, code, rate in rails if code == 4 and rate > 0), default=0.0)
        for rule in self._nic_rate:
            nominal_q = rule.params.get("nominal")
            nominal = nominal_q.value if nominal_q is not None else 0.0
            compare = rule.params.get("compare_rails", True)
            for comp, s, code, rate in rails:
                bad = code == 4 and rate > 0 and ((nominal and rate < nominal) or (compare and rate < top))
                if bad:
                    expected = max(nominal, top if compare else 0.0)
                    self._bad(
                        rule,
                        comp,
                        "nic",
                        nid,
                        nid,
                        f"{comp} negotiated {rate:g} Gb/s, expected {expected:g} Gb/s",
                        self._nic_evidence(
                            comp,
                            s,
                            rate_gbps=rate,
                            nominal_gbps=nominal or None,
                            max_rail_gbps=top if compare else None,
                            unit="Gb/s",
                        ),
                        now,
                    )
                elif owned:
                    self._good(owned, rule, comp, now)

    def _nic_evidence(self, comp: str, s: tpb.NicSample, **extra: Any) -> dict[str, Any]:
        evidence: dict[str, Any] = {"rdma_device": s.rdma_device, "port": s.port, "netdev": s.netdev}
        if self.fabric is not None:
            evidence.update(nic_fabric_evidence(self.fabric, comp))
        evidence.update(extra)
        return evidence

    # -- reports: switch -------------------------------------------------------------------

    def _switch_ports(self, nid: str, ports: Iterable[tpb.SwitchPortSample], now: int) -> None:
        owned = self._by_owner.get(nid)
        for p in ports:
            if self._port_state and p.oper_status in ("up", "down"):
                bad = p.oper_status == "down" and p.admin_status == "up"
                for rule in self._port_state:
                    if bad:
                        comp, ctype, peer = self._port_component(nid, p.port)
                        self._bad(
                            rule,
                            comp,
                            ctype,
                            None,
                            nid,
                            f"{nid} {p.port} oper down (admin up)",
                            _port_evidence(nid, p, peer, oper_status=p.oper_status, admin_status=p.admin_status),
                            now,
                        )
                    elif owned:
                        self._good(owned, rule, self._port_component(nid, p.port)[0], now)
            if self._pfc_wd:
                stormed = [i for i, st in enumerate(p.pfc_wd_status) if st == "stormed"]
                for rule in self._pfc_wd:
                    if stormed:
                        comp, ctype, peer = self._port_component(nid, p.port)
                        self._bad(
                            rule,
                            comp,
                            ctype,
                            None,
                            nid,
                            f"{nid} {p.port}: PFC watchdog stormed on queue(s) {', '.join(map(str, stormed))}",
                            _port_evidence(nid, p, peer, stormed_queues=stormed, deadlocks=p.pfc_wd_deadlocks),
                            now,
                        )
                    elif owned and p.pfc_wd_status:
                        self._good(owned, rule, self._port_component(nid, p.port)[0], now)
            if self._optics and (p.HasField("optic_temperature_c") or p.optic_rx_power_dbm or p.optic_tx_power_dbm):
                for rule in self._optics:
                    faults = _optic_faults(p, rule.params["checks"])
                    if faults:
                        comp, ctype, peer = self._port_component(nid, p.port)
                        self._bad(
                            rule,
                            comp,
                            ctype,
                            None,
                            nid,
                            f"{nid} {p.port} optics out of range: " + "; ".join(f["text"] for f in faults),
                            _port_evidence(nid, p, peer, faults=faults),
                            now,
                        )
                    elif owned:
                        self._good(owned, rule, self._port_component(nid, p.port)[0], now)

    def _port_component(self, switch: str, port: str) -> tuple[str, ComponentType, str | None]:
        """The cable when the fabric knows what the port connects to, else the switch port."""
        fabric = self.fabric
        if fabric is not None:
            peer = fabric.peer_at(switch, port)
            if peer is not None:
                return fabric.link_name(switch, peer), "link", peer
        return switch_port_name(switch, port), "switch", None

    # -- reports: host ---------------------------------------------------------------------

    def _host(self, nid: str, h: tpb.HostSample, now: int) -> None:
        owned = self._by_owner.get(nid)
        for rule in self._disk:
            limit = rule.params["min_free"]
            ignore = rule.params["ignore_mounts"]
            worst: tuple[float, tpb.DiskUsage, float] | None = None
            for d in h.disks:
                if not d.total_bytes or d.mount in ignore:
                    continue
                free = max(d.total_bytes - d.used_bytes, 0)
                pct = 100.0 * free / d.total_bytes
                measure = pct if limit.dimension == "percent" else float(free)
                if measure < limit.value and (worst is None or measure < worst[0]):
                    worst = (measure, d, pct)
            if worst is not None:
                _, d, pct = worst
                free = max(d.total_bytes - d.used_bytes, 0)
                self._bad(
                    rule,
                    nid,
                    "node",
                    nid,
                    nid,
                    f"{nid}: {d.mount} has {pct:.1f}% free (minimum {limit.text})",
                    {
                        "mount": d.mount,
                        "free_bytes": free,
                        "total_bytes": d.total_bytes,
                        "free_pct": round(pct, 2),
                        "threshold": limit.text,
                    },
                    now,
                )
            elif owned and h.disks:
                self._good(owned, rule, nid, now)
        if self._memory and h.memory_total_bytes:
            pct = 100.0 * h.memory_available_bytes / h.memory_total_bytes
            for rule in self._memory:
                limit = rule.params["min_available"]
                measure = pct if limit.dimension == "percent" else float(h.memory_available_bytes)
                if measure < limit.value:
                    self._bad(
                        rule,
                        nid,
                        "node",
                        nid,
                        nid,
                        f"{nid}: {pct:.1f}% of memory available (minimum {limit.text})",
                        {
                            "available_bytes": h.memory_available_bytes,
                            "total_bytes": h.memory_total_bytes,
                            "available_pct": round(pct, 2),
                            "threshold": limit.text,
                        },
                        now,
                    )
                elif owned:
                    self._good(owned, rule, nid, now)

    # -- counters --------------------------------------------------------------------------

    def _measure(
        self, rule: Rule, entity: str, counter: str, sample: RateSample | None, now: int
    ) -> tuple[float, bool] | None:
        """(rate per second or count in window, saturated) for one counter; None when unknown yet."""
        if rule.window_s:
            total, saturated = self.rates.window_sum(entity, counter, rule.window_s, now)
            if sample is not None and sample.saturated:
                saturated = True
            value = total / rule.window_s if rule.threshold_is_rate else float(total)
            return value, saturated
        if sample is None:
            return None
        return sample.rate, sample.saturated

    def _exceeds(self, rule: Rule, value: float, saturated: bool) -> bool:
        if value >= rule.threshold:
            return True
        fires = rule.params.get("saturated_fires")
        return saturated and (self._saturated_fires if fires is None else fires)

    def _window_count(self, entry: _Entry, now: int) -> int:
        """Events or counter increments still inside the entry's window."""
        rule = entry.rule
        if rule.kind == "event":
            wkey = (entry.owner, rule.id, entry.cond.component)
            win = self._event_windows.get(wkey)
            if not win:
                return 0
            horizon = now - int(rule.window_s * 1000)
            while win and win[0][0] <= horizon:
                win.popleft()
            return sum(c for _, c in win)
        total = 0
        for key in entry.counters:
            count, saturated = self.rates.window_sum(entry.entity, key, rule.window_s, now)
            total += count + (1 if saturated else 0)
        return total

    # -- condition lifecycle ---------------------------------------------------------------

    def _bad(
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
        confirmed: bool = True,
    ) -> _Entry:
        """A report shows the bad state: open, or refresh silently (announce only a changed verdict)."""
        key = (rule.id, comp)
        entry = self._active.get(key)
        if entry is None:
            entry = self._open(
                rule, comp, ctype, node, owner, message, evidence, now, 1, action=action, severity=severity
            )
            entry.confirmed = confirmed
            return entry
        cond = entry.cond
        cond.count += 1
        cond.last_seen_ms = now
        cond.message = message
        keep: dict[str, Any] = {k: cond.evidence[k] for k in ("first_event_ts_ms", "event") if k in cond.evidence}
        cond.evidence = {**evidence, **keep}
        entry.touched_ms = now
        entry.good = 0
        if not entry.confirmed and confirmed:
            entry.confirmed = True
            self._held.pop(key, None)
        changed = (action is not None and action != cond.action) or (severity is not None and severity != cond.severity)
        if changed:
            cond.action = action or cond.action
            cond.severity = severity or cond.severity  # type: ignore[assignment]
            self._repeat(entry, now)
        return entry

    def _good(self, owned: dict[_Key, _Entry], rule: Rule, comp: str, now: int) -> None:
        entry = owned.get((rule.id, comp))
        if entry is None:
            return
        entry.good += 1
        if entry.good >= rule.resolve_after:
            self._resolve(entry, now, reason="good_state")

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
    ) -> _Entry:
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
        entry = _Entry(cond, rule, owner, now, now)
        self._active[cond.key] = entry
        self._by_owner.setdefault(owner, {})[cond.key] = entry
        log.info(
            "condition_opened", rule=rule.id, component=comp, severity=cond.severity, action=cond.action, count=count
        )
        self._emit("opened", entry, now)
        return entry

    def _set_recovery(self, entry: _Entry, value: int) -> None:
        name, action = xidcat.recovery_action(value)
        entry.cond.action = action
        entry.cond.severity = _recovery_severity(entry.rule, action)  # type: ignore[assignment]
        entry.cond.evidence["recovery_action"] = value
        entry.cond.evidence["recovery_action_name"] = name

    def _repeat(self, entry: _Entry, now: int) -> None:
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

    def _resolve(self, entry: _Entry, now: int, reason: str) -> None:
        cond = entry.cond
        key = cond.key
        if self._active.get(key) is not entry:
            return
        self._finalize(key)
        del self._active[key]
        owned = self._by_owner.get(entry.owner)
        if owned is not None:
            owned.pop(key, None)
        self._held.pop(key, None)
        self._windowed.pop(key, None)
        self._dirty.pop(key, None)
        cond.resolved_ms = now
        log.info("condition_resolved", rule=cond.rule, component=cond.component, reason=reason, count=cond.count)
        self._batch.append(["resolved", entry, _snapshot(cond)])

    def _emit(self, kind: ConditionChangeKind, entry: _Entry, now: int) -> None:
        key = entry.cond.key
        self._finalize(key)
        self._batch_idx[key] = len(self._batch)
        self._batch.append([kind, entry, None])
        entry.emitted_ms = now
        entry.dirty = False
        self._dirty.pop(key, None)

    def _finalize(self, key: _Key) -> None:
        idx = self._batch_idx.pop(key, None)
        if idx is not None and self._batch[idx][2] is None:
            self._batch[idx][2] = _snapshot(self._batch[idx][1].cond)

    def _flush(self) -> list[ConditionChange]:
        if not self._batch:
            return []
        out = [
            ConditionChange(kind, snap if snap is not None else _snapshot(entry.cond))
            for kind, entry, snap in self._batch
        ]
        self._batch.clear()
        self._batch_idx.clear()
        return out

    # -- naming ----------------------------------------------------------------------------

    def _node_ctx(self, node: NodeRecord) -> _NodeCtx:
        """Naming for a node, cached until it re-registers (stream_token) or its LLDP list is replaced."""
        ctx = self._ctx.get(node.node_id)
        lldp_id = id(node.lldp)
        if ctx is not None and ctx.token == node.stream_token and ctx.lldp_id == lldp_id:
            return ctx
        inv = node.inventory
        ctx = _NodeCtx(
            token=node.stream_token,
            lldp_id=lldp_id,
            namer=NicNamer(node.node_id, inv, node.lldp or None),
            gpu_by_pci={vocab.pci_key(g.pci_bus_id): g.index for g in inv.gpus if g.pci_bus_id},
            nic_by_pci={},
            gpu_indices=frozenset(g.index for g in inv.gpus),
            gpu_comp={},
            nic_ports={},
        )
        ctx.gpu_comp = {i: gpu_name(node.node_id, f"gpu-{i}") for i in ctx.gpu_indices}
        for n in inv.nics:
            name = ctx.namer.nic(f"{n.rdma_device}/{n.port}")
            if name is not None and n.pci_address:
                ctx.nic_by_pci[vocab.pci_key(n.pci_address)] = name
        self._ctx[node.node_id] = ctx
        return ctx


# -- helpers -------------------------------------------------------------------------------


def nic_fabric_evidence(fabric: Fabric, comp: str) -> dict[str, Any]:
    """The leaf and leaf port a NIC is cabled to, for a condition's evidence ({} if not known).

    Detection shards run without the fabric (it changes as LLDP is learned); the controller
    adds this to their NIC conditions (Detection.on_shard_changes).
    """
    if comp in fabric and fabric.kind(comp) == "nic":
        leaf = fabric.leaf_of(comp)
        if leaf is not None:
            return {"leaf": leaf, "leaf_port": fabric.port_of(comp)}
    return {}


def _tuple_getter(*names: str) -> Callable[[Any], tuple[Any, ...]]:
    """attrgetter that always returns a tuple (attrgetter of one name returns the bare value)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _worse(measured: tuple[float, bool], worst: tuple[Any, ...]) -> bool:
    """Whether a counter's (value, saturated) replaces the worst so far: a higher value, or
    saturated where the worst is not (a saturated counter's value is only a lower bound, and
    ``_exceeds`` may fire on saturation alone). NIC and NVLink counter rules both pick this way."""
    return measured[0] > worst[0] or (measured[1] and not worst[1])


def _snapshot(cond: Condition) -> Condition:
    return replace(cond, evidence=dict(cond.evidence))


def _occurrences(ev: tpb.Event) -> int:
    """How many occurrences an event stands for: an agent storm summary carries 'suppressed'."""
    suppressed = ev.attributes.get("suppressed") if ev.attributes else None
    if suppressed:
        try:
            return max(int(suppressed), 1)
        except ValueError:
            return 1
    return 1


def _mask(rule: Rule) -> int:
    mask = 0
    for bit in rule.params["reasons"]:
        mask |= bit
    return mask


def _reason_names(bits: int) -> list[tuple[str, int]]:
    return [(name, b) for name, b in CLOCK_REASON_BITS.items() if bits & b]


def _recovery_severity(rule: Rule, action: str) -> str:
    """At least the rule's severity; a reboot is fatal."""
    derived = vocab.severity_for_action(action, rule.severity)
    if derived == "info":
        return rule.severity
    return derived if SEVERITY_ORDER[derived] > SEVERITY_ORDER[rule.severity] else rule.severity


def _port_evidence(switch: str, p: tpb.SwitchPortSample, peer: str | None, **extra: Any) -> dict[str, Any]:
    evidence: dict[str, Any] = {"switch": switch, "port": p.port}
    if peer is not None:
        evidence["peer"] = peer
    evidence.update(extra)
    return evidence


def _optic_faults(p: tpb.SwitchPortSample, checks: tuple[str, ...]) -> list[dict[str, Any]]:
    """Readings outside the module's own alarm thresholds (a missing threshold is not checked)."""
    faults: list[dict[str, Any]] = []

    def check(what: str, value: float, lane: int | None, low: float | None, high: float | None, unit: str) -> None:
        where = what if lane is None else f"{what} lane {lane}"
        if high is not None and value > high:
            faults.append(
                {
                    "check": what,
                    "lane": lane,
                    "value": value,
                    "limit": high,
                    "unit": unit,
                    "text": f"{where} {value:g}{unit} above {high:g}{unit}",
                }
            )
        elif low is not None and value < low:
            faults.append(
                {
                    "check": what,
                    "lane": lane,
                    "value": value,
                    "limit": low,
                    "unit": unit,
                    "text": f"{where} {value:g}{unit} below {low:g}{unit}",
                }
            )

    def opt(fld: str) -> float | None:
        return getattr(p, fld) if p.HasField(fld) else None

    if "temperature" in checks and p.HasField("optic_temperature_c"):
        check(
            "temperature",
            p.optic_temperature_c,
            None,
            opt("optic_temp_low_alarm_c"),
            opt("optic_temp_high_alarm_c"),
            "C",
        )
    if "rx_power" in checks:
        low, high = opt("optic_rx_power_low_alarm_dbm"), opt("optic_rx_power_high_alarm_dbm")
        for lane, v in enumerate(p.optic_rx_power_dbm, start=1):
            check("rx_power", v, lane, low, high, "dBm")
    if "tx_power" in checks:
        low, high = opt("optic_tx_power_low_alarm_dbm"), opt("optic_tx_power_high_alarm_dbm")
        for lane, v in enumerate(p.optic_tx_power_dbm, start=1):
            check("tx_power", v, lane, low, high, "dBm")
    return faults


def _threshold_message(rule: Rule, what: str, value: float, saturated: bool) -> str:
    threshold = rule.params["threshold"]
    if rule.threshold_is_rate:
        measured = f"{value:.3g}/s" + (f" over {rule.window_s:g}s" if rule.window_s else "")
    else:
        measured = f"{value:g} in {rule.window_s:g}s"
    if saturated:
        return f"{what}: counter saturated, at least {measured} (threshold {threshold.text})"
    return f"{what}: {measured} (threshold {threshold.text})"


def _threshold_evidence(rule: Rule, counter: str, value: float, saturated: bool, **extra: Any) -> dict[str, Any]:
    threshold = rule.params["threshold"]
    evidence: dict[str, Any] = {
        "counter": counter,
        "rate" if rule.threshold_is_rate else "count": round(value, 6),
        "threshold": threshold.value,
        "threshold_text": threshold.text,
        "unit": threshold.unit,
        "window_s": rule.window_s or None,
        "saturated": saturated,
        "at_least": saturated,
    }
    evidence.update(extra)
    return evidence
