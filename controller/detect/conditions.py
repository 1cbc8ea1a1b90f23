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

What is bad is the evaluators' to say (controller.detect.evaluators: one per rule kind,
listed in one registry); the engine keeps the lifecycle above, names components, reads
each sample once, and asks each evaluator about the components it can say something
about. That fast path is built here from what the evaluators declare (the fields they
read, the fields whose zero means "nothing to say"), so a new kind is on it by
construction. A delta report is read through ``ReportView`` (controller.detect.view): no
evaluator sees one.

Components are fabric names ("node-003/gpu-5", "node-003/nic-5", "leaf-b0-r3:Ethernet8"
or, when the fabric knows the cable, "node-003/nic-5<->leaf-b0-r3"). ``on_report`` runs
for every report, so it does dict lookups and arithmetic only; messages and evidence are
built just for components in a bad state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import and_
from typing import Any

import structlog
from google.protobuf.descriptor import FieldDescriptor

from controller.detect.evaluators.base import (
    Evaluator,
    EventEvaluator,
    GpuEvaluator,
    GpuSetEvaluator,
    HostEvaluator,
    LinkCounterEvaluator,
    LinkStateEvaluator,
    NicCounterEvaluator,
    NicEvaluator,
    NicPort,
    NicSetEvaluator,
    PresenceEvaluator,
    Setup,
    SwitchPortEvaluator,
)
from controller.detect.model import ComponentType, Condition, ConditionChange, ConditionChangeKind, Rule
from controller.detect.nvlinks import Links
from controller.detect.rates import CounterRate, RateSample
from controller.detect.rules import RuleSet
from controller.detect.view import ReportView, tuple_getter
from controller.fabric import Fabric
from controller.fabric.naming import NicNamer, gpu_name, switch_port_name
from controller.ingest.registry import NodeRecord
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.clock import Clock
from starpulse.core.findings import event_kind_name
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

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
        tpb.EVENT_KIND_ACCEL_FAULT,  # a vendor fault code is about one chip
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
_MAX_EVENT_WINDOW = 4096
_MAX_CACHED_PORTS = 256  # per node: a report names at most MAX_NICS ports; a stranger is named per report
_SWITCH = ipb.NODE_ROLE_SWITCH
_NIC_NAMING = ("rdma_device", "port")  # the first fields of the one read per port: its name
_WAKE_TYPES = frozenset(
    {
        FieldDescriptor.CPPTYPE_BOOL,
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    }
)


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
    nic_inventory: dict[str, str]  # inventory port "mlx5_0/1" -> its component, for nic_set kinds
    # (rdma_device, port) -> ("dev/port", component name, on a rail): the NIC naming of every report
    nic_ports: dict[tuple[str, int], tuple[str, str, bool]]
    # Issue 30: a component in the node operator's words beside the fabric's name: a NIC's
    # "mlx5_3/1, eth3" (ibstat, ip link), a GPU's "index 3, PCI 0000:1b:00.0" (nvidia-smi, lspci).
    words: dict[str, str] = field(default_factory=dict)


class ConditionEngine:
    """Applies a RuleSet to what agents send; keeps the active conditions.

    Not thread-safe: call it from the controller's event loop, as the registry does.
    Changes returned carry snapshots; ``active()`` returns the live conditions (read only).
    It is the evaluators' ``Judge``: they say ``bad``, ``good`` or ``clear``, it decides what
    that does to a condition.
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
        self._update_ms = int(rules.defaults.update_interval_s * 1000)
        self._counter_ms = int(rules.defaults.counter_interval_s * 1000)
        self._active: dict[_Key, _Entry] = {}
        self._by_owner: dict[str, dict[_Key, _Entry]] = {}
        self._open_at: dict[str, int] = {}  # component -> its active conditions (of any rule)
        self._held: dict[_Key, _Entry] = {}  # resolve on hold expiry
        self._windowed: dict[_Key, _Entry] = {}  # resolve when their window empties
        self._dirty: dict[_Key, _Entry] = {}  # updates deferred by the rate limit
        self._event_windows: dict[tuple[str, str, str], deque[tuple[int, int]]] = {}
        self._ctx: dict[str, _NodeCtx] = {}
        self._batch: list[list[Any]] = []  # [kind, entry, snapshot | None]
        self._batch_idx: dict[_Key, int] = {}
        self._sampled: dict[str, int] = {}  # counter entity -> controller time of its last read
        self._nvlink_names: dict[int, tuple[str, ...]] = {}  # link count -> "nvlink-<pos>/<counter>" names
        # GPU -> the link counter values of its last NVLink counter read (often the base's own tuple)
        self._link_read: dict[str, tuple[int, ...]] = {}
        self._build()

    # -- the fast path, from what the evaluators declare -----------------------------------

    def _build(self) -> None:
        """One evaluator per kind in use, grouped by where the engine asks it, and the reads
        per GPU and per NIC port that hold every field they declare."""
        present = [(cls, self.rules.by_kind.get(cls.kind, ())) for cls in self.rules.registry]
        present = [(cls, rules) for cls, rules in present if rules]
        # Per GPU, one C-level read: the wake fields first (with their masks, a healthy GPU is
        # one `any` over them: nothing set, nothing to ask), "lost", then the other fields read.
        wake: dict[str, int] = {}
        gpu_reads: dict[str, None] = {}
        always: set[type[Evaluator]] = set()
        for cls, rules in present:
            if issubclass(cls, GpuEvaluator):
                for rule in rules:
                    masks = cls.wake(rule)
                    if masks is None:
                        always.add(cls)
                    else:
                        for fld, mask in masks.items():
                            wake[fld] = wake.get(fld, 0) | mask
                    gpu_reads.update(dict.fromkeys(cls.reads(rule)))
        wake["lost"] = -1  # a lost GPU is judged only by the kinds that judge it (judges_lost_gpus)
        gpu_layout = (*wake, *(f for f in gpu_reads if f not in wake))
        _check_fields("GPU fast path", tpb.GpuSample.DESCRIPTOR, gpu_layout, wake)
        nic_reads = dict.fromkeys(
            f for cls, rules in present if issubclass(cls, NicEvaluator) for rule in rules for f in cls.reads(rule)
        )
        nic_layout = (*_NIC_NAMING, *(f for f in nic_reads if f not in _NIC_NAMING))
        _check_fields("NIC fast path", tpb.NicSample.DESCRIPTOR, nic_layout, {})
        nic_counters = tuple(
            k for cls, rules in present if issubclass(cls, NicCounterEvaluator) for r in rules for k in cls.counters(r)
        )
        link_counters = tuple(
            c for cls, rules in present if issubclass(cls, LinkCounterEvaluator) for r in rules for c in cls.reads(r)
        )
        _check_fields("NVLink counters", tpb.NvLinkSample.DESCRIPTOR, link_counters, {})
        self.view = ReportView(nic_counters, link_counters)
        setup = Setup(
            judge=self,
            defaults=self.rules.defaults,
            rates=self.rates,
            gpu_fields={f: i for i, f in enumerate(gpu_layout)},
            nic_fields={f: i for i, f in enumerate(nic_layout)},
        )
        self._gpu_read = tuple_getter(*gpu_layout)
        self._gpu_masks = tuple(wake.values())
        self._lost_at = setup.gpu_fields["lost"]
        self._nic_read = tuple_getter(*nic_layout)
        self._nic_names = self.view.nic_names
        self._link_counters = self.view.link_counters
        self._evaluators: dict[str, Evaluator] = {cls.kind: cls(rules, setup) for cls, rules in present}
        evs = list(self._evaluators.values())
        gpu = [e for e in evs if isinstance(e, GpuEvaluator)]
        pre = [e for e in gpu if e.judges_lost_gpus]
        post = [e for e in gpu if not e.judges_lost_gpus]
        # A woken GPU (a wake field set, or a condition open on it) is asked by every GPU kind;
        # a quiet one only by the kinds without a wake (they must look at every GPU).
        self._gpu_pre, self._gpu_post = tuple(pre), tuple(post)
        self._gpu_quiet = tuple(e for e in (*pre, *post) if type(e) in always)
        self._link_state = tuple(e for e in evs if isinstance(e, LinkStateEvaluator))
        self._link_counter = tuple(e for e in evs if isinstance(e, LinkCounterEvaluator))
        self._gpu_sets = tuple(e for e in evs if isinstance(e, GpuSetEvaluator))
        self._nic_ports = tuple(e for e in evs if isinstance(e, NicEvaluator))
        self._nic_sets = tuple(e for e in evs if isinstance(e, NicSetEvaluator))
        self._nic_counter = tuple(e for e in evs if isinstance(e, NicCounterEvaluator))
        self._switch_port = tuple(e for e in evs if isinstance(e, SwitchPortEvaluator))
        self._host = tuple(e for e in evs if isinstance(e, HostEvaluator))
        presence = [e for e in evs if isinstance(e, PresenceEvaluator)]
        self._presence_switch = tuple(e for e in presence if e.switches)
        self._presence_compute = tuple(e for e in presence if not e.switches)
        self._has_gpu_checks = bool(gpu or self._link_state or self._link_counter)
        self._has_links = bool(self._link_state or self._link_counter)
        self._has_nic_checks = bool(self._nic_ports or self._nic_counter)

    # -- public API ------------------------------------------------------------------------

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> list[ConditionChange]:
        """Apply a batch of new events from one node."""
        now = self._clock()
        rules = self.rules
        evaluators = self._evaluators
        for ev in events:
            kind = ev.kind
            for rule in rules.resolving_event.get(kind, ()):
                comp, _, _ = self._event_component(node, ev)
                entry = self._active.get((rule.id, comp))
                if entry is not None:
                    self._resolve(entry, now, reason=event_kind_name(kind))
            matched = rules.event_rules(kind, ev.xid, ev.action)
            if not matched:
                continue
            sev = _EVENT_SEVERITY.get(ev.severity, 0)
            comp, ctype, owner_node = self._event_component(node, ev)
            n = _occurrences(ev)
            for rule in matched:
                evaluator = evaluators[rule.kind]
                if isinstance(evaluator, EventEvaluator):
                    if evaluator.accepts(rule, sev, ev.action):
                        self._on_event_rule(rule, node.node_id, comp, ctype, owner_node, ev, n, now)
                elif sev > 0:  # a state rule opened early; info events (restored, admin down) never open
                    self._on_state_event(rule, node.node_id, comp, ctype, owner_node, ev, n, now)
        return self._flush()

    def on_report(self, node: NodeRecord, report: tpb.Report) -> list[ConditionChange]:
        """Evaluate every report-driven rule against one report."""
        now = self._clock()
        ts = report.timestamp_ms or now
        nid = node.node_id
        self.view.begin(report)  # a delta report reads as the full one it stands for
        if node.role == _SWITCH:
            if report.switch_ports:
                self._switch_ports(nid, report.switch_ports, now)
            return self._flush()
        ctx = self._node_ctx(node)
        gpus = report.gpus  # each repeated field is read once per report
        if gpus or self._gpu_sets:
            seen = self._gpus(nid, ctx, gpus, ts, now) if self._has_gpu_checks else None
            if self._gpu_sets:
                owned = self._by_owner.get(nid)
                for evaluator in self._gpu_sets:
                    evaluator.gpu_set(nid, ctx.gpu_indices, ctx.gpu_comp, report, seen, now, owned)
        if self._has_nic_checks:
            nics = report.nics
            if nics:
                self._nics(nid, ctx, nics, ts, now)
        if self._nic_sets and ctx.nic_inventory:
            owned = self._by_owner.get(nid)
            for nic_set in self._nic_sets:
                nic_set.nic_set(nid, ctx.nic_inventory, report, now, owned)
        if self._host and report.HasField("host"):
            h = report.host
            owned = self._by_owner.get(nid)
            for check in self._host:
                check.host(nid, h, now, owned)
        if report.switch_ports:  # a compute node does not report switch ports; tolerate it
            self._switch_ports(nid, report.switch_ports, now)
        return self._flush()

    def on_presence(self, node: NodeRecord, old: str, new: str) -> list[ConditionChange]:
        """Heartbeat (compute) or switch-silent (switch) conditions from presence changes."""
        now = self._clock()
        for evaluator in self._presence_switch if node.role == _SWITCH else self._presence_compute:
            evaluator.presence(node, old, new, now)
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
        for entity in [e for e in self._link_read if e.startswith(f"{node_id}/")]:
            del self._link_read[entity]
        self.view.forget(node_id)
        dropped = self.rates.forget(node_id)
        log.info("condition_node_forgotten", node=node_id, counters_dropped=dropped)
        return self._flush()

    # -- reports ---------------------------------------------------------------------------

    def _gpus(self, nid: str, ctx: _NodeCtx, gpus: Iterable[tpb.GpuSample], ts: int, now: int) -> list[int]:
        """Every per-GPU kind; a healthy GPU with nothing open on it costs one read of its fields
        and one `any` (and, in a full report, one links_key; in a delta report its links cost
        nothing). Returns the indices reported."""
        seen: list[int] = []
        comps = ctx.gpu_comp
        owned = self._by_owner.get(nid)
        open_at = self._open_at
        read, masks, lost_at = self._gpu_read, self._gpu_masks, self._lost_at
        quiet = self._gpu_quiet
        has_links, links, link_base, full = self._has_links, self.view.links, self.view.link_base, self.view.full
        link_state, link_counter = self._link_state, self._link_counter
        sampled, counter_ms = self._sampled, self._counter_ms
        for g in gpus:
            index = g.index
            seen.append(index)
            comp = comps.get(index) or gpu_name(nid, f"gpu-{index}")
            state = read(g)
            # asked: a wake field set, or a condition open on this GPU (nothing else can change)
            if (owned and comp in open_at) or any(map(and_, state, masks)):
                for check in self._gpu_pre:
                    check.gpu(nid, comp, g, state, now, owned)
                if state[lost_at]:
                    continue  # a lost GPU: nothing else was readable, neither bad nor good
                checks = self._gpu_post
            else:
                checks = quiet
            for check in checks:
                check.gpu(nid, comp, g, state, now, owned)
            if not has_links:
                continue
            # the view's links; a delta report's GPU without links is the base itself (inline: no call)
            view = link_base.get(comp) if not full and not g.nvlinks else links(comp, g)
            if view is None:
                continue
            if link_state and (view.down or (owned and comp in open_at)):  # all up, nothing open: no verdict
                for state_check in link_state:
                    state_check.links(nid, comp, view, now, owned)
            if link_counter:
                last = sampled.get(comp)  # due, inline: most reports do not read the counters
                if last is None or now - last >= counter_ms:
                    sampled[comp] = now
                    samples = self._link_samples(comp, view, ts, now)
                    for counter_check in link_counter:
                        counter_check.link_counters(nid, comp, view, samples, now, owned)
        return seen

    def _link_samples(self, comp: str, view: Links, ts: int, now: int) -> Mapping[str, RateSample] | None:
        """The GPU's NVLink counters into the rates (when due): counters equal to the last read's
        (the common case: the same tuple, the base's) are not handed to the rates again."""
        numbers = view.numbers
        names = self._nvlink_names.get(len(numbers))
        if names is None:
            names = self._nvlink_names[len(numbers)] = tuple(
                f"nvlink-{pos}/{c}" for pos in range(len(numbers)) for c in self._link_counters
            )
        values = view.values
        last = self._link_read.get(comp)
        self._link_read[comp] = values
        if (last is values or last == values) and self.rates.unchanged(comp, ts, names):
            return None  # what update_group answers for the values it already holds
        return self.rates.update_group(comp, ts, names, values, now)

    def _nics(self, nid: str, ctx: _NodeCtx, nics: Iterable[tpb.NicSample], ts: int, now: int) -> None:
        """Name and read each port once; its counters when due; then the port kinds, all ports at once."""
        owned = self._by_owner.get(nid)
        seen: list[NicPort] | None = [] if self._nic_ports else None
        ports = ctx.nic_ports
        read = self._nic_read
        counter_checks = self._nic_counter
        view = self.view
        keep_base = view.full  # a full report's counters are every later delta's base: read them all
        sampled = self._sampled
        counter_ms = self._counter_ms
        for s in nics:
            state = read(s)
            port = (state[0], state[1])
            named = ports.get(port)
            if named is None:
                local = f"{port[0]}/{port[1]}"
                name = ctx.namer.nic(local)
                named = (local, name or f"{nid}/{local}", name is not None)
                if len(ports) < _MAX_CACHED_PORTS:
                    ports[port] = named
            local, comp, on_rail = named
            if seen is not None:
                seen.append((comp, local, s, state, on_rail))
            if counter_checks:
                last = sampled.get(comp)  # due, inline: most reports do not read the counters
                due = last is None or now - last >= counter_ms
                if due:
                    sampled[comp] = now
                elif not keep_base:
                    continue
                values = view.nic_counters(comp, s)
                if due:
                    samples = self.rates.update_group(comp, ts, self._nic_names, values, now)
                    for counter_check in counter_checks:
                        counter_check.nic_counters(nid, comp, s, samples, now, owned)
        if seen:
            for check in self._nic_ports:
                check.nics(nid, seen, now, owned)

    def _switch_ports(self, nid: str, ports: Iterable[tpb.SwitchPortSample], now: int) -> None:
        owned = self._by_owner.get(nid)
        checks = self._switch_port
        for p in ports:
            for check in checks:
                check.port(nid, p, now, owned)

    # -- the Judge: what evaluators tell the engine -----------------------------------------

    def nic_evidence(self, comp: str, s: tpb.NicSample, **extra: Any) -> dict[str, Any]:
        evidence: dict[str, Any] = {"rdma_device": s.rdma_device, "port": s.port, "netdev": s.netdev}
        if self.fabric is not None:
            evidence.update(nic_fabric_evidence(self.fabric, comp))
        evidence.update(extra)
        return evidence

    def port_component(self, switch: str, port: str) -> tuple[str, ComponentType, str | None]:
        """The cable when the fabric knows what the port connects to, else the switch port."""
        fabric = self.fabric
        if fabric is not None:
            peer = fabric.peer_at(switch, port)
            if peer is not None:
                return fabric.link_name(switch, peer), "link", peer
        return switch_port_name(switch, port), "switch", None

    def clear(self, rule: Rule, comp: str, now: int, reason: str) -> None:
        entry = self._active.get((rule.id, comp))
        if entry is not None:
            self._resolve(entry, now, reason=reason)

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
            self._evaluators[rule.kind].opened_by_event(rule, entry.cond, ev)
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
        if ev.xid and ev.kind == tpb.EVENT_KIND_SXID:
            evidence["sxid"] = ev.xid  # an NVSwitch code, never to be read (or escalated) as a GPU Xid
        elif ev.xid:
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
                name, ctype, _ = self.port_component(nid, comp)
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

    # -- counters --------------------------------------------------------------------------

    def _window_count(self, entry: _Entry, now: int) -> int:
        """Events or counter increments still inside the entry's window."""
        rule = entry.rule
        if isinstance(self._evaluators.get(rule.kind), EventEvaluator):
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
        entry = self._active.get(key)
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

    def _refresh(
        self, entry: _Entry, message: str, evidence: dict[str, Any], now: int, action: str | None, severity: str | None
    ) -> None:
        cond = entry.cond
        cond.count += 1
        cond.last_seen_ms = now
        cond.message = self._in_operator_words(cond.node, cond.component, message)
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

    def _in_operator_words(self, node: str | None, comp: str, message: str) -> str:
        """The message naming a NIC or GPU as the node's operator sees it too (NIC evidence has the
        port's rdma_device, port and netdev already; a GPU's index is in its component name)."""
        ctx = self._ctx.get(node) if node is not None else None
        words = ctx.words.get(comp) if ctx is not None else None
        return message if words is None else with_operator_words(message, comp, words)

    def good(self, owned: Mapping[_Key, _Entry] | None, rule: Rule, comp: str, now: int) -> None:
        """A report shows the good state: after ``resolve_after`` in a row, resolve."""
        if not owned:
            return
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
        message = self._in_operator_words(node, comp, message)
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
        self._open_at[comp] = self._open_at.get(comp, 0) + 1
        log.info(
            "condition_opened", rule=rule.id, component=comp, severity=cond.severity, action=cond.action, count=count
        )
        self._emit("opened", entry, now)
        return entry

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
        left = self._open_at.pop(cond.component, 1) - 1
        if left:
            self._open_at[cond.component] = left
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
            nic_inventory={},
            nic_ports={},
        )
        ctx.gpu_comp = {i: gpu_name(node.node_id, f"gpu-{i}") for i in ctx.gpu_indices}
        for g in inv.gpus:
            kind = "NPU" if g.vendor == "ascend" else "GPU"
            pci = f", PCI {g.pci_bus_id}" if g.pci_bus_id and g.pci_bus_id != "NA" else ""
            ctx.words[ctx.gpu_comp[g.index]] = f"{kind} {g.index}{pci}"
        for n in inv.nics:
            local = f"{n.rdma_device}/{n.port}"
            name = ctx.namer.nic(local)
            ctx.nic_inventory[local] = name or f"{node.node_id}/{local}"  # as _nics names a port
            ctx.words[ctx.nic_inventory[local]] = f"{local}, {n.netdev}" if n.netdev else local
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


def _check_fields(what: str, desc: Any, names: Iterable[str], wake: Mapping[str, int]) -> None:
    """Evaluators declare fields by name: a name the message lacks, or a wake field that is
    not an integer or a flag, is a bug in an evaluator, found when the engine is built."""
    fields = desc.fields_by_name
    for name in names:
        f = fields.get(name)
        if f is None:
            raise ValueError(f"{what}: an evaluator reads {name!r}, which {desc.name} does not have")
        if name in wake and f.cpp_type not in _WAKE_TYPES:
            raise ValueError(f"{what}: {desc.name}.{name} is not an integer or a flag, so it cannot wake a GPU")


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


def with_operator_words(message: str, comp: str, words: str) -> str:
    """``message`` naming ``comp`` also as its node's operator sees it (``words``), once.

    "node-001/nic-3 (mlx5_3/1) is DOWN" -> "node-001/nic-3 (mlx5_3/1, eth3) is DOWN";
    "node-001/gpu-3: ..." -> "node-001/gpu-3 (GPU 3, PCI 0000:1b:00.0): ...".
    """
    if words in message:
        return message
    local = words.split(",", 1)[0]
    if f"({local})" in message:
        return message.replace(f"({local})", f"({words})", 1)
    if message.startswith(comp):
        return f"{comp} ({words}){message[len(comp) :]}"
    return f"{message} [{words}]"
