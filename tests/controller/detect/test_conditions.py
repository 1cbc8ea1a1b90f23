"""The condition engine: every default rule opens on crafted data and resolves when it clears."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from controller.detect.conditions import ConditionEngine
from controller.detect.model import ConditionChange
from controller.fabric import generate_fabric
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import (
    NODE,
    RULES,
    compute_node,
    good_report,
    make_engine,
    opened,
    resolved,
)
from tests.support.conditions import pcie_link as _pcie_link

SWITCH = "leaf-b0-r5"


def switch_node(name: str = SWITCH) -> NodeRecord:
    return NodeRecord(node_id=name, role=ipb.NODE_ROLE_SWITCH, state="online", first_seen_ms=0, last_seen_ms=0)


def good_switch_report(ts: int) -> tpb.Report:
    r = tpb.Report(seq=1, timestamp_ms=ts)
    for port in ("Ethernet8", "Ethernet12"):
        p = r.switch_ports.add(port=port, oper_status="up", admin_status="up", speed_mbps=400_000)
        p.pfc_wd_status.extend(["operational", "operational"])
        p.optic_temperature_c = 40
        p.optic_temp_high_alarm_c = 75
        p.optic_temp_low_alarm_c = -5
        p.optic_rx_power_dbm.extend([-2.0] * 4)
        p.optic_rx_power_low_alarm_dbm = -10
        p.optic_rx_power_high_alarm_dbm = 5
        p.optic_tx_power_dbm.extend([0.0] * 4)
        p.optic_tx_power_low_alarm_dbm = -8
        p.optic_tx_power_high_alarm_dbm = 5
    return r


def event(kind: int, component: str, severity: int = tpb.SEVERITY_CRITICAL, **kw) -> tpb.Event:
    return tpb.Event(kind=kind, component=component, severity=severity, timestamp_ms=123, **kw)


# -- table of report-driven cases: (rule, mutate the report into the bad state, component, keep_bad_counters) ------


def _gpu(i: int = 5) -> Callable[[tpb.Report], tpb.GpuSample]:
    return lambda r: next(g for g in r.gpus if g.index == i)


def _nic(r: tpb.Report, i: int = 5) -> tpb.NicSample:
    return r.nics[i]


def _set(getter: Callable[[tpb.Report], object], attr: str, value: object) -> Callable[[tpb.Report], None]:
    return lambda r: setattr(getter(r), attr, value)


def _nic_counter(source: str, counter: str, value: int) -> Callable[[tpb.Report], None]:
    def mutate(r: tpb.Report) -> None:
        getattr(_nic(r), source)[counter] = value

    return mutate


def _drop_gpu(r: tpb.Report) -> None:
    del r.gpus[5]


def _nvlink_down(r: tpb.Report) -> None:
    _gpu()(r).nvlinks[1].up = False


def _nvlink_errors(r: tpb.Report) -> None:
    _gpu()(r).nvlinks[1].crc_flit_errors = 10_000


def _slow_rate(r: tpb.Report) -> None:
    _nic(r).rate_gbps = 200


def _nic_down(r: tpb.Report) -> None:
    n = _nic(r)
    n.state_code, n.state, n.phys_state_code, n.phys_state = 1, "DOWN", 3, "Disabled"


def _drop_nic(r: tpb.Report) -> None:
    del r.nics[5]


def _disk(r: tpb.Report) -> None:
    r.host.disks.add(mount="/data", total_bytes=1000, used_bytes=980)


def _memory(r: tpb.Report) -> None:
    r.host.memory_available_bytes = 10


@dataclass
class ReportCase:
    rule: str
    bad: Callable[[tpb.Report], None]
    component: str
    ctype: str
    counters: bool = False  # the clear report keeps the bad (cumulative) values
    evidence: dict = field(default_factory=dict)
    healthy: Callable[[tpb.Report], None] | None = None  # fields the rule reads that good_report leaves out
    quiet: Callable[[tpb.Report], None] | None = None  # looks bad, must not open the rule


REPORT_CASES = [
    ReportCase("gpu.remap_pending", _set(_gpu(), "remap_pending", True), f"{NODE}/gpu-5", "gpu"),
    ReportCase("gpu.remap_failure", _set(_gpu(), "remap_failure", True), f"{NODE}/gpu-5", "gpu"),
    ReportCase("gpu.lost", _set(_gpu(), "lost", True), f"{NODE}/gpu-5", "gpu"),
    ReportCase("gpu.reset_required", _set(_gpu(), "reset_required", True), f"{NODE}/gpu-5", "gpu"),
    ReportCase("gpu.missing", _drop_gpu, f"{NODE}/gpu-5", "gpu", evidence={"reported_gpus": 7, "inventory_gpus": 8}),
    ReportCase("nic.missing", _drop_nic, f"{NODE}/nic-5", "nic", evidence={"port": "mlx5_5/1", "inventory_ports": 8}),
    ReportCase(
        "gpu.recovery_action",
        _set(_gpu(), "recovery_action", 2),
        f"{NODE}/gpu-5",
        "gpu",
        evidence={"recovery_action": 2, "recovery_action_name": "NODE_REBOOT"},
    ),
    ReportCase("gpu.nvlink_down", _nvlink_down, f"{NODE}/gpu-5", "gpu", evidence={"links_down": [1]}),
    ReportCase(
        "gpu.nvlink_errors",
        _nvlink_errors,
        f"{NODE}/gpu-5",
        "gpu",
        counters=True,
        evidence={"counter": "crc_flit_errors", "link": 1, "unit": "/s"},
    ),
    ReportCase(
        "gpu.hw_slowdown",
        _set(_gpu(), "clock_event_reasons", 0x40 | 0x4),
        f"{NODE}/gpu-5",
        "gpu",
        evidence={"reasons": ["HwThermalSlowdown"]},
    ),
    ReportCase("nic.port_down", _nic_down, f"{NODE}/nic-5", "nic", evidence={"state": "DOWN"}),
    ReportCase(
        "nic.flap",
        _nic_counter("counters", "link_downed", 3),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
        evidence={"counter": "counters/link_downed", "count": 3.0},
    ),
    ReportCase(
        "nic.phy_errors",
        _nic_counter("counters", "symbol_error", 600),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
        evidence={"counter": "counters/symbol_error", "rate": 10.0, "threshold": 0.1, "unit": "/s"},
    ),
    ReportCase(
        "nic.link_error_recovery",
        _set(_nic, "phys_state_code", 6),
        f"{NODE}/nic-5",
        "nic",
        evidence={"field": "phys_state_code", "value": 6, "rdma_device": "mlx5_5"},
    ),
    ReportCase(
        "nic.transport_errors",
        _nic_counter("hw_counters", "out_of_sequence", 6000),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
        evidence={"counter": "hw_counters/out_of_sequence", "rate": 100.0},
    ),
    ReportCase(
        "nic.retries_exceeded",
        _nic_counter("hw_counters", "req_transport_retries_exceeded", 1),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
    ),
    ReportCase(
        "nic.rate_below_nominal",
        _slow_rate,
        f"{NODE}/nic-5",
        "nic",
        evidence={"rate_gbps": 200, "max_rail_gbps": 400},
    ),
    ReportCase(
        "nic.pfc_pause_storm",
        _nic_counter("ethtool_stats", "tx_prio3_pause", 300_000),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
        evidence={"counter": "ethtool_stats/tx_prio3_pause", "rate": 10_000.0},
    ),
    ReportCase(
        "nic.pause_storm_prevention",
        _nic_counter("ethtool_stats", "tx_pause_storm_error_events", 1),
        f"{NODE}/nic-5",
        "nic",
        counters=True,
    ),
    ReportCase(
        "gpu.pcie_link_narrow",
        _pcie_link(width=8),
        f"{NODE}/gpu-5",
        "gpu",
        evidence={"field": "pcie_link_width", "value": 8, "other_value": 16},
        healthy=_pcie_link(),
        quiet=_pcie_link(gen=1, util=0.0),  # an idle GPU at Gen1 keeps all its lanes
    ),
    ReportCase(
        "gpu.pcie_link_slow",
        _pcie_link(gen=3),
        f"{NODE}/gpu-5",
        "gpu",
        evidence={"field": "pcie_link_gen", "value": 3, "when": "utilization_gpu_pct 95 >= 50%"},
        healthy=_pcie_link(),
        quiet=_pcie_link(gen=1, util=0.0),  # idle GPUs drop their generation: not a fault
    ),
    # Any vendor's interconnect and thermal flag (an AMD or Ascend report fills the neutral fields).
    ReportCase(
        "gpu.link_down",
        _set(_gpu(), "links_down", 1),
        f"{NODE}/gpu-5",
        "gpu",
        healthy=lambda r: [setattr(g, "links_down", 0) for g in r.gpus],
    ),
    ReportCase(
        "gpu.thermal_slowdown",
        _set(_gpu(), "thermal_slowdown", True),
        f"{NODE}/gpu-5",
        "gpu",
        healthy=lambda r: [setattr(g, "thermal_slowdown", False) for g in r.gpus],
    ),
    ReportCase("host.disk_full", _disk, NODE, "node", evidence={"mount": "/data", "free_pct": 2.0}),
    ReportCase("host.memory_low", _memory, NODE, "node", evidence={"available_pct": 1.0}),
]


def _port(name: str) -> Callable[[tpb.Report], tpb.SwitchPortSample]:
    return lambda r: next(p for p in r.switch_ports if p.port == name)


def _port_down(r: tpb.Report) -> None:
    _port("Ethernet12")(r).oper_status = "down"


def _stormed(r: tpb.Report) -> None:
    _port("Ethernet12")(r).pfc_wd_status[1] = "stormed"


def _hot_optic(r: tpb.Report) -> None:
    _port("Ethernet12")(r).optic_temperature_c = 80


def _dark_optic(r: tpb.Report) -> None:
    _port("Ethernet12")(r).optic_rx_power_dbm[2] = -40


CABLE = f"{NODE}/nic-5<->{SWITCH}"
SWITCH_CASES = [
    ReportCase("switch.port_down", _port_down, CABLE, "link", evidence={"oper_status": "down", "admin_status": "up"}),
    ReportCase("switch.pfc_watchdog_storm", _stormed, CABLE, "link", evidence={"stormed_queues": [1]}),
    ReportCase("switch.optics", _hot_optic, CABLE, "link"),
    ReportCase("switch.optics", _dark_optic, CABLE, "link"),
]

# -- table of event-driven cases: (rule, event, component, severity, action) -------------------------------------

X = tpb.EVENT_KIND_XID


def _accel(action: str) -> tpb.Event:
    """A vendor's fault code (here Ascend's) whose level the agent mapped to ``action``."""
    return event(tpb.EVENT_KIND_ACCEL_FAULT, "gpu-5", action=action, vendor="ascend", vendor_code="80E18005")


EVENT_CASES = [
    ("gpu.xid.restart_app", event(X, "gpu-5", xid=13), f"{NODE}/gpu-5", "warning", "restart_app"),
    ("gpu.xid.reset_gpu", event(X, "gpu-5", xid=48), f"{NODE}/gpu-5", "critical", "reset_gpu"),
    (
        "gpu.xid.reset_gpu",
        event(X, "gpu@0000:1c:00", xid=74, pci="0000:1c:00"),
        f"{NODE}/gpu-5",
        "critical",
        "reset_gpu",
    ),
    ("gpu.xid.reboot", event(X, "gpu-5", xid=79), f"{NODE}/gpu-5", "fatal", "reboot"),
    ("gpu.xid.contact_support", event(X, "gpu-5", xid=61), f"{NODE}/gpu-5", "critical", "contact_support"),
    ("gpu.xid.ignore", event(X, "gpu-5", xid=63), f"{NODE}/gpu-5", "info", "none"),
    ("gpu.xid.ignore", event(X, "gpu-5", xid=92), f"{NODE}/gpu-5", "info", "none"),
    ("gpu.xid.investigate", event(X, "gpu-5", xid=154), f"{NODE}/gpu-5", "warning", "investigate"),
    ("gpu.xid.investigate", event(X, "gpu-5", xid=4242), f"{NODE}/gpu-5", "warning", "investigate"),
    # An SXid's own action (its class, from the kmsg parser) picks the rule; one without says investigate.
    ("gpu.sxid", event(tpb.EVENT_KIND_SXID, "nvswitch@0000:05:00.0", xid=22013), NODE, "warning", "check_hardware"),
    (
        "gpu.sxid",
        event(tpb.EVENT_KIND_SXID, "nvswitch@0000:05:00.0", xid=22013, action="investigate"),
        NODE,
        "warning",
        "check_hardware",
    ),
    (
        "gpu.sxid.reboot",
        event(tpb.EVENT_KIND_SXID, "nvswitch@0000:05:00.0", xid=12022, action="reboot"),
        NODE,
        "critical",
        "reboot",
    ),
    ("gpu.ecc_dbe", event(tpb.EVENT_KIND_ECC_DBE, "gpu-5"), f"{NODE}/gpu-5", "critical", "reset_gpu"),
    ("nic.driver_error", event(tpb.EVENT_KIND_NIC_DRIVER_ERROR, "ibp5"), f"{NODE}/nic-5", "warning", "investigate"),
    ("host.kernel", event(tpb.EVENT_KIND_KERNEL, "nvidia-peermem"), NODE, "warning", "investigate"),
    (
        "agent.buffer_reset",
        event(tpb.EVENT_KIND_BUFFER_RESET, "agent", severity=tpb.SEVERITY_WARNING),
        NODE,
        "warning",
        "investigate",
    ),
    *(
        (f"gpu.accel_fault.{action}", _accel(action), f"{NODE}/gpu-5", severity, action)
        for action, severity in (
            ("restart_app", "warning"),
            ("reset_gpu", "critical"),
            ("reboot", "fatal"),
            ("contact_support", "critical"),
            ("investigate", "warning"),
        )
    ),
]

# State rules an event opens early (a later good report resolves them).
STATE_EVENT_CASES = [
    ("gpu.remap_failure", event(tpb.EVENT_KIND_ROW_REMAP_FAILURE, "gpu-5"), f"{NODE}/gpu-5"),
    ("gpu.lost", event(tpb.EVENT_KIND_GPU_LOST, "gpu-5", severity=tpb.SEVERITY_FATAL, xid=79), f"{NODE}/gpu-5"),
    ("gpu.reset_required", event(tpb.EVENT_KIND_GPU_RESET_REQUIRED, "gpu-5"), f"{NODE}/gpu-5"),
    (
        "gpu.recovery_action",
        event(tpb.EVENT_KIND_GPU_RECOVERY_ACTION, "gpu-5", attributes={"recovery_action": "1"}),
        f"{NODE}/gpu-5",
    ),
    ("gpu.nvlink_down", event(tpb.EVENT_KIND_NVLINK_DOWN, "gpu-5"), f"{NODE}/gpu-5"),
    (
        "gpu.hw_slowdown",
        event(tpb.EVENT_KIND_THERMAL_SLOWDOWN, "gpu-5", severity=tpb.SEVERITY_WARNING),
        f"{NODE}/gpu-5",
    ),
    ("nic.port_down", event(tpb.EVENT_KIND_NIC_LINK_DOWN, "mlx5_5/1"), f"{NODE}/nic-5"),
]


def _feed(engine: ConditionEngine, clock: FakeClock, node: NodeRecord, report: tpb.Report) -> list[ConditionChange]:
    report.timestamp_ms = clock.time_ms()
    return engine.on_report(node, report)


class TestEveryDefaultRule:
    def test_table_covers_every_default_rule(self):
        """Every rule in the packaged file has a case below that fires it."""
        covered = {c.rule for c in REPORT_CASES + SWITCH_CASES}
        covered |= {c[0] for c in EVENT_CASES + STATE_EVENT_CASES}
        covered |= {"nic.flap_events", "node.heartbeat_lost", "switch.silent"}
        assert covered == set(RULES.ids())

    @pytest.mark.parametrize("case", REPORT_CASES, ids=lambda c: c.rule)
    def test_report_rule_opens_and_resolves(self, case: ReportCase):
        """A crafted bad report opens the rule's condition; reports back in the good state resolve it."""
        engine, clock = make_engine()
        node = compute_node()

        def good() -> tpb.Report:
            r = good_report(0)
            if case.healthy is not None:
                case.healthy(r)
            return r

        assert _feed(engine, clock, node, good()) == []
        if case.quiet is not None:
            clock.advance(60)
            looks_bad = good()
            case.quiet(looks_bad)
            assert _feed(engine, clock, node, looks_bad) == []
        clock.advance(60)
        bad = good()
        case.bad(bad)
        changes = _feed(engine, clock, node, bad)
        assert opened(changes) == [(case.rule, case.component)], changes
        cond = engine.get(case.rule, case.component)
        assert cond is not None
        assert cond.component_type == case.ctype
        assert cond.node == NODE
        assert cond.category == RULES.get(case.rule).category
        for k, v in case.evidence.items():
            assert cond.evidence[k] == pytest.approx(v) if isinstance(v, float) else cond.evidence[k] == v, (k, cond)
        clear_changes: list[ConditionChange] = []
        for _ in range(15):
            clock.advance(61)
            clear = good()
            if case.counters:
                case.bad(clear)  # cumulative counters stay where they were: no new errors
            clear_changes += _feed(engine, clock, node, clear)
            clear_changes += engine.tick()
            if engine.get(case.rule, case.component) is None:
                break
        assert resolved(clear_changes) == [(case.rule, case.component)]
        assert engine.active() == []

    @pytest.mark.parametrize("case", SWITCH_CASES, ids=lambda c: f"{c.rule}-{c.bad.__name__}")
    def test_switch_rule_names_the_cable(self, case: ReportCase):
        """A switch port the fabric knows is named as its cable, with the peer NIC in evidence and no node."""
        fabric = generate_fabric(32, gpus_per_node=8, rails=8, nodes_per_block=16, spines=8)
        assert fabric.peer_at(SWITCH, "Ethernet12") == f"{NODE}/nic-5"
        engine, clock = make_engine(fabric)
        sw = switch_node()
        assert _feed(engine, clock, sw, good_switch_report(0)) == []
        bad = good_switch_report(0)
        case.bad(bad)
        clock.advance(5)
        assert opened(_feed(engine, clock, sw, bad)) == [(case.rule, case.component)]
        cond = engine.get(case.rule, case.component)
        assert cond is not None
        assert (cond.component_type, cond.node) == (case.ctype, None)
        assert cond.evidence["peer"] == f"{NODE}/nic-5"
        assert cond.evidence["port"] == "Ethernet12"
        changes: list[ConditionChange] = []
        for _ in range(RULES.get(case.rule).resolve_after):
            clock.advance(5)
            changes += _feed(engine, clock, sw, good_switch_report(0))
        assert resolved(changes) == [(case.rule, case.component)]

    def test_switch_port_without_fabric(self):
        """Without a fabric the component is the switch port itself, typed switch."""
        engine, clock = make_engine()
        bad = good_switch_report(clock.time_ms())
        _port_down(bad)
        assert opened(engine.on_report(switch_node(), bad)) == [("switch.port_down", f"{SWITCH}:Ethernet12")]
        assert engine.active()[0].component_type == "switch"

    def test_admin_down_port_is_intended(self):
        """A port an operator shut (admin down) is not a condition."""
        engine, clock = make_engine()
        r = good_switch_report(clock.time_ms())
        _port_down(r)
        _port("Ethernet12")(r).admin_status = "down"
        assert engine.on_report(switch_node(), r) == []

    @pytest.mark.parametrize(("rule", "ev", "component", "severity", "action"), EVENT_CASES)
    def test_event_rule_opens_and_holds(self, rule, ev, component, severity, action):
        """An event opens its rule's condition with the rule's severity and action; it resolves after hold."""
        engine, clock = make_engine()
        changes = engine.on_events(compute_node(), [ev])
        assert opened(changes) == [(rule, component)]
        cond = changes[0].condition
        assert (cond.severity, cond.action, cond.count) == (severity, action, 1)
        if ev.xid and ev.kind == X:
            assert cond.evidence["xid"] == ev.xid
        hold_s = RULES.get(rule).hold_ms / 1000
        clock.advance(hold_s - 1)
        assert engine.tick() == []
        clock.advance(1)
        assert resolved(engine.tick()) == [(rule, component)]

    @pytest.mark.parametrize(("rule", "ev", "component"), STATE_EVENT_CASES)
    def test_state_rule_opened_by_event_resolves_on_good_report(self, rule, ev, component):
        """An event opens a state rule before the next report; a good report resolves it."""
        engine, clock = make_engine()
        node = compute_node()
        assert opened(engine.on_events(node, [ev])) == [(rule, component)]
        changes: list[ConditionChange] = []
        for _ in range(RULES.get(rule).resolve_after):
            clock.advance(5)
            changes += _feed(engine, clock, node, good_report(0))
        assert resolved(changes) == [(rule, component)]

    def test_state_event_without_report_expires(self):
        """A state condition opened by an event that no report ever confirms expires after hold."""
        engine, clock = make_engine()
        engine.on_events(compute_node(), [event(tpb.EVENT_KIND_NVLINK_DOWN, "gpu-5")])
        clock.advance(RULES.get("gpu.nvlink_down").hold_ms / 1000)
        assert resolved(engine.tick()) == [("gpu.nvlink_down", f"{NODE}/gpu-5")]

    def test_accel_fault_opens_only_the_rule_of_its_action(self):
        """A vendor fault code opens the one rule of the action its level maps to; "none" opens nothing."""
        engine, _ = make_engine()
        changes = engine.on_events(compute_node(), [_accel("reset_gpu")])
        assert opened(changes) == [("gpu.accel_fault.reset_gpu", f"{NODE}/gpu-5")]
        assert engine.on_events(compute_node(), [_accel("none")]) == []

    def test_info_event_does_not_open_state_rule(self):
        """Info-level events (a storm restored, a port shut by an operator) never open a state rule."""
        engine, _ = make_engine()
        ev = event(tpb.EVENT_KIND_SWITCH_PORT_DOWN, "Ethernet12", severity=tpb.SEVERITY_INFO)
        assert engine.on_events(switch_node(), [ev]) == []

    def test_switch_port_event(self):
        """A switch_port_down event from a switch agent opens the port condition at once."""
        engine, _ = make_engine()
        changes = engine.on_events(switch_node(), [event(tpb.EVENT_KIND_SWITCH_PORT_DOWN, "Ethernet12")])
        assert opened(changes) == [("switch.port_down", f"{SWITCH}:Ethernet12")]
        assert changes[0].condition.node is None

    def test_recovery_action_sets_action_and_severity(self):
        """The recovery-action value names the action; a reboot escalates to fatal."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        _gpu()(r).recovery_action = 1
        cond = engine.on_report(node, r)[0].condition
        assert (cond.action, cond.severity) == ("reset_gpu", "critical")
        clock.advance(5)
        r = good_report(clock.time_ms())
        _gpu()(r).recovery_action = 7
        changes = engine.on_report(node, r)
        assert [(c.kind, c.condition.action, c.condition.severity) for c in changes] == [("updated", "reboot", "fatal")]

    def test_sw_power_cap_is_normal(self):
        """SwPowerCap and GpuIdle bits never open a slowdown condition."""
        engine, clock = make_engine()
        r = good_report(clock.time_ms())
        _gpu()(r).clock_event_reasons = 0x1 | 0x4 | 0x20 | 0x2
        assert engine.on_report(compute_node(), r) == []

    def test_failed_gpu_collector_is_not_missing_gpus(self):
        """A report whose GPU collector failed does not say the GPUs are missing."""
        engine, clock = make_engine()
        r = good_report(clock.time_ms())
        del r.gpus[:]
        r.collectors[0].ok = False
        assert engine.on_report(compute_node(), r) == []


class TestStorms:
    def test_ten_thousand_identical_xids_one_condition(self):
        """10,000 identical Xid events are one condition with count 10,000 and one opened change."""
        engine, _clock = make_engine()
        node = compute_node()
        changes = engine.on_events(node, [event(X, "gpu-5", xid=79) for _ in range(10_000)])
        assert [c.kind for c in changes] == ["opened"]
        assert changes[0].condition.count == 10_000
        active = engine.active()
        assert len(active) == 1
        assert active[0].count == 10_000

    def test_updates_at_most_once_per_second(self):
        """Events one by one within a second emit no update; tick then emits one with the total."""
        engine, clock = make_engine()
        node = compute_node()
        kinds = []
        for _ in range(10_000):
            kinds += [c.kind for c in engine.on_events(node, [event(X, "gpu-5", xid=13)])]
        assert kinds == ["opened"]
        assert engine.tick() == []
        clock.advance(1)
        changes = engine.tick()
        assert [(c.kind, c.condition.count) for c in changes] == [("updated", 10_000)]
        assert engine.tick() == []

    def test_repeat_after_interval_updates_immediately(self):
        """A repeat more than a second after the last change is announced at once."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_events(node, [event(X, "gpu-5", xid=13)])
        clock.advance(2)
        changes = engine.on_events(node, [event(X, "gpu-5", xid=13)])
        assert [(c.kind, c.condition.count) for c in changes] == [("updated", 2)]

    def test_agent_storm_summary_counts_suppressed(self):
        """An agent's storm summary (attribute suppressed=N) adds N to the count."""
        engine, _ = make_engine()
        node = compute_node()
        engine.on_events(node, [event(X, "gpu-5", xid=13)])
        engine.on_events(node, [event(X, "gpu-5", xid=13, attributes={"suppressed": "9999"})])
        assert engine.get("gpu.xid.restart_app", f"{NODE}/gpu-5").count == 10_000

    def test_different_gpus_are_different_conditions(self):
        """The same Xid on two GPUs is two conditions."""
        engine, _ = make_engine()
        changes = engine.on_events(compute_node(), [event(X, "gpu-1", xid=13), event(X, "gpu-2", xid=13)])
        assert len(opened(changes)) == 2

    def test_changes_are_snapshots(self):
        """A returned change does not move when the live condition is updated later."""
        engine, clock = make_engine()
        node = compute_node()
        first = engine.on_events(node, [event(X, "gpu-5", xid=13)])[0].condition
        clock.advance(2)
        engine.on_events(node, [event(X, "gpu-5", xid=13)])
        assert first.count == 1
        assert engine.get("gpu.xid.restart_app", f"{NODE}/gpu-5").count == 2


class TestFlaps:
    def test_link_down_events_counted_in_window(self):
        """Three link-down events within the window open nic.flap_events; it resolves when the window empties."""
        engine, clock = make_engine()
        node = compute_node()
        down = event(tpb.EVENT_KIND_NIC_LINK_DOWN, "mlx5_5/1")
        key = ("nic.flap_events", f"{NODE}/nic-5")
        assert key not in opened(engine.on_events(node, [down]))
        clock.advance(200)
        assert key not in opened(engine.on_events(node, [down]))
        clock.advance(200)
        changes = engine.on_events(node, [down])
        assert key in opened(changes)
        assert engine.get(*key).count == 3
        clock.advance(599)
        assert key not in resolved(engine.tick())
        clock.advance(1)
        assert key in resolved(engine.tick())

    def test_events_outside_window_do_not_count(self):
        """Link-down events spread wider than the window never add up to a flap."""
        engine, clock = make_engine()
        node = compute_node()
        for _ in range(5):
            changes = engine.on_events(node, [event(tpb.EVENT_KIND_NIC_LINK_DOWN, "mlx5_5/1")])
            assert ("nic.flap_events", f"{NODE}/nic-5") not in opened(changes)
            clock.advance(301)

    def test_link_downed_counter_flaps(self):
        """link_downed rising by 3 within 10 minutes is a flap; by 2 it is not."""
        engine, clock = make_engine()
        node = compute_node()
        for value, expect in ((0, False), (1, False), (2, False), (3, True)):
            r = good_report(clock.time_ms())
            r.nics[5].counters["link_downed"] = value
            changes = engine.on_report(node, r)
            assert (("nic.flap", f"{NODE}/nic-5") in opened(changes)) is expect
            clock.advance(60)

    def test_skipped_reports_lose_nothing(self):
        """Counters read every counter_interval still see errors from the reports in between."""
        engine, clock = make_engine()
        node = compute_node()
        for value in (0, 2, 3):  # 5 s apart: the middle report is not read (interval 15 s)
            r = good_report(clock.time_ms())
            r.nics[5].counters["link_downed"] = value
            engine.on_report(node, r)
            clock.advance(5)
        clock.advance(5)
        r = good_report(clock.time_ms())
        r.nics[5].counters["link_downed"] = 3
        assert opened(engine.on_report(node, r)) == [("nic.flap", f"{NODE}/nic-5")]

    def test_counter_reset_is_not_an_error_burst(self):
        """A counter that drops (driver reload) to a small value is a small delta, not a burst."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        r.nics[5].hw_counters["out_of_sequence"] = 5_000_000
        engine.on_report(node, r)
        clock.advance(60)
        r = good_report(clock.time_ms())
        r.nics[5].hw_counters["out_of_sequence"] = 2
        assert engine.on_report(node, r) == []


class TestPresence:
    def test_heartbeat_lost_and_back(self):
        """A compute node going unreachable opens node.heartbeat_lost on the node; online resolves it."""
        engine, _ = make_engine()
        node = compute_node()
        changes = engine.on_presence(node, "online", "unreachable")
        assert opened(changes) == [("node.heartbeat_lost", NODE)]
        assert changes[0].condition.category == "heartbeat"
        assert changes[0].condition.node == NODE
        assert resolved(engine.on_presence(node, "unreachable", "online")) == [("node.heartbeat_lost", NODE)]

    def test_switch_silent(self):
        """A switch going unreachable opens switch.silent on the switch, with no compute node."""
        engine, _ = make_engine()
        sw = switch_node()
        changes = engine.on_presence(sw, "online", "unreachable")
        assert opened(changes) == [("switch.silent", SWITCH)]
        cond = changes[0].condition
        assert (cond.category, cond.component_type, cond.node) == ("switch", "switch", None)
        assert resolved(engine.on_presence(sw, "unreachable", "online")) == [("switch.silent", SWITCH)]


class TestNamingAndForget:
    def test_nic_named_by_lldp_leaf(self):
        """Without a PCIe pairing, a NIC whose LLDP neighbour is a rail leaf takes that rail's name."""
        engine, _clock = make_engine()
        node = compute_node()
        for nic in node.inventory.nics:
            nic.ClearField("paired_gpu_index")
        node.lldp = [ipb.LldpNeighbor(local_interface="ibp5", chassis_name="leaf-b0-r2", port_id="Ethernet12")]
        changes = engine.on_events(node, [event(tpb.EVENT_KIND_NIC_LINK_DOWN, "mlx5_5/1")])
        assert opened(changes) == [("nic.port_down", f"{NODE}/nic-2")]

    def test_namer_rebuilt_when_lldp_changes(self):
        """A new LLDP list renames an unpaired NIC on the next event."""
        engine, _ = make_engine()
        node = compute_node()
        for nic in node.inventory.nics:
            nic.ClearField("paired_gpu_index")
        engine.on_events(node, [event(tpb.EVENT_KIND_NIC_DRIVER_ERROR, "ibp5")])
        node.lldp = [ipb.LldpNeighbor(local_interface="ibp5", chassis_name="leaf-b0-r6")]
        changes = engine.on_events(node, [event(tpb.EVENT_KIND_NIC_DRIVER_ERROR, "ibp5")])
        assert opened(changes) == [("nic.driver_error", f"{NODE}/nic-6")]

    def test_pcie_pairing_outranks_lldp(self):
        """A paired NIC keeps its PCIe name when LLDP shows another leaf: a miswire, not a rename."""
        engine, _ = make_engine()
        node = compute_node()
        node.lldp = [ipb.LldpNeighbor(local_interface="ibp5", chassis_name="leaf-b0-r2", port_id="Ethernet12")]
        changes = engine.on_events(node, [event(tpb.EVENT_KIND_NIC_LINK_DOWN, "mlx5_5/1")])
        assert opened(changes) == [("nic.port_down", f"{NODE}/nic-5")]

    def test_forget_resolves_and_drops_state(self):
        """forget(node) resolves its conditions and drops its counters."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, good_report(clock.time_ms()))
        engine.on_events(node, [event(X, "gpu-5", xid=79)])
        assert engine.rates.entities()
        changes = engine.forget(NODE)
        assert resolved(changes) == [("gpu.xid.reboot", f"{NODE}/gpu-5")]
        assert engine.active() == []
        assert engine.rates.entities() == []

    def test_report_is_cheap_when_healthy(self):
        """A healthy report produces no changes and opens nothing, repeatedly."""
        engine, clock = make_engine()
        node = compute_node()
        for _ in range(20):
            assert engine.on_report(node, good_report(clock.time_ms())) == []
            clock.advance(5)
        assert engine.active() == []
