"""The report path: one report read once, each evaluator asked about what it can judge.

It walks a report as the plan (controller.detect.plan) lays it out: a healthy GPU with
nothing open on it costs one read of its fields and one ``any``; NIC ports are named once
per node and read once; counters go to the rates every ``counter_interval``. It runs for
every report, so it does dict lookups and arithmetic only; messages and evidence are built
by the evaluators just for components in a bad state. A delta report is read through
``ReportView`` (controller.detect.view): no evaluator sees one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import and_

from controller.detect.evaluators.base import NicPort
from controller.detect.lifecycle import Lifecycle
from controller.detect.naming import SWITCH, Naming, NodeNames
from controller.detect.nvlinks import Links
from controller.detect.plan import Plan
from controller.detect.rates import CounterRate, RateSample
from controller.fabric.naming import gpu_name
from controller.ingest.registry import NodeRecord
from starpulse.v1 import telemetry_pb2 as tpb

_MAX_CACHED_PORTS = 256  # per node: a report names at most MAX_NICS ports; a stranger is named per report


class ReportPath:
    """Reports and presence changes into evaluator verdicts (into the lifecycle's batch)."""

    def __init__(self, plan: Plan, naming: Naming, lifecycle: Lifecycle, rates: CounterRate, counter_ms: int) -> None:
        self.view = plan.view
        self._naming = naming
        self._rates = rates
        self._counter_ms = counter_ms
        self._by_owner = lifecycle.by_owner  # the lifecycle's own dicts, never rebound there
        self._open_at = lifecycle.open_at
        self._gpu_read, self._gpu_masks, self._lost_at = plan.gpu_read, plan.gpu_masks, plan.lost_at
        self._nic_read = plan.nic_read
        self._nic_names = self.view.nic_names
        self._link_counters = self.view.link_counters
        self._gpu_pre, self._gpu_post, self._gpu_quiet = plan.gpu_pre, plan.gpu_post, plan.gpu_quiet
        self._link_state, self._link_counter = plan.link_state, plan.link_counter
        self._gpu_sets, self._nic_sets = plan.gpu_sets, plan.nic_sets
        self._nic_ports, self._nic_counter = plan.nic_ports, plan.nic_counter
        self._switch_port, self._host = plan.switch_port, plan.host
        self._presence_switch, self._presence_compute = plan.presence_switch, plan.presence_compute
        self._has_gpu_checks = bool(plan.gpu_pre or plan.gpu_post or self._link_state or self._link_counter)
        self._has_links = bool(self._link_state or self._link_counter)
        self._has_nic_checks = bool(self._nic_ports or self._nic_counter)
        self._sampled: dict[str, int] = {}  # counter entity -> controller time of its last read
        self._nvlink_names: dict[int, tuple[str, ...]] = {}  # link count -> "nvlink-<pos>/<counter>" names
        # GPU -> the link counter values of its last NVLink counter read (often the base's own tuple)
        self._link_read: dict[str, tuple[int, ...]] = {}

    def on_report(self, node: NodeRecord, report: tpb.Report, now: int) -> None:
        ts = report.timestamp_ms or now
        nid = node.node_id
        self.view.begin(report)  # a delta report reads as the full one it stands for
        if node.role == SWITCH:
            if report.switch_ports:
                self._switch_ports(nid, report.switch_ports, now)
            return
        ctx = self._naming.node(node)
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

    def on_presence(self, node: NodeRecord, old: str, new: str, now: int) -> None:
        for evaluator in self._presence_switch if node.role == SWITCH else self._presence_compute:
            evaluator.presence(node, old, new, now)

    def forget(self, node_id: str) -> None:
        """Drop a node's counter read times and its view (the rates are the engine's)."""
        for entity in [e for e in self._sampled if e == node_id or e.startswith((f"{node_id}/", f"{node_id}:"))]:
            del self._sampled[entity]
        for entity in [e for e in self._link_read if e.startswith(f"{node_id}/")]:
            del self._link_read[entity]
        self.view.forget(node_id)

    def _gpus(self, nid: str, ctx: NodeNames, gpus: Iterable[tpb.GpuSample], ts: int, now: int) -> list[int]:
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
        if (last is values or last == values) and self._rates.unchanged(comp, ts, names):
            return None  # what update_group answers for the values it already holds
        return self._rates.update_group(comp, ts, names, values, now)

    def _nics(self, nid: str, ctx: NodeNames, nics: Iterable[tpb.NicSample], ts: int, now: int) -> None:
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
                    samples = self._rates.update_group(comp, ts, self._nic_names, values, now)
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
