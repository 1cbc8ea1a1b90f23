"""A switch that says its ports are clean is not blamed for them (issue 18, must-have 4).

Several nodes of one leaf failing together blame the leaf, unless the leaf's own agent
reports the ports of those links up and clean in a report taken after the fault: then the
nodes' NIC faults stay NIC incidents. A leaf that reports them down, or says nothing new,
is one switch incident, with no node blamed and none evicted.
"""

from __future__ import annotations

import sqlite3

import pytest

from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.incidents import IncidentStore
from controller.detect.model import Condition
from controller.detect.pipeline import Detection
from controller.detect.rules import load_rules
from controller.detect.switch_witness import SwitchPortWitness
from controller.fabric import Fabric
from controller.ingest.registry import ONLINE, NodeRecord
from controller.metrics import ControllerMetrics
from starpulse.core.clock import FakeClock
from starpulse.core.vocab import EVICTABLE_KINDS
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.correlate import clock, fabric, nic_down, opened, settle

__all__ = ["clock", "fabric"]  # the correlator tests' fixtures, used here by name

LEAF = "leaf-b0-r3"  # rail 3 of block 0: node-000..node-015's nic-3
NODES = (1, 2, 3)


def port(oper: str = "up", in_errors: int = 0, name: str = "Ethernet0", **kw: object) -> tpb.SwitchPortSample:
    return tpb.SwitchPortSample(
        port=name,
        oper_status=oper,
        admin_status="up",
        counters={"SAI_PORT_STAT_IF_IN_ERRORS": in_errors, "SAI_PORT_STAT_IF_IN_OCTETS": 7},
        **kw,  # type: ignore[arg-type]
    )


def leaf_ports(fabric: Fabric, oper: str = "up", in_errors: int = 0) -> list[tpb.SwitchPortSample]:
    """The leaf's ports toward nic-3 of NODES, as its SONiC agent reports them."""
    names = [fabric.port_of(f"node-{n:03d}/nic-3") for n in NODES]
    assert all(names)
    return [port(oper, in_errors, name=str(name)) for name in names]


def nic_errors(n: int, clock: FakeClock) -> Condition:
    cond = nic_down(n, 3, clock)
    cond.rule, cond.category, cond.severity, cond.message = "nic.phy_errors", "nic_errors", "warning", "errors"
    return cond


class TestSwitchPortWitness:
    def test_clean_means_up_steady_and_taken_after_the_moment_asked_about(self) -> None:
        w = SwitchPortWitness()
        w.saw(LEAF, [port()], 1_000)
        assert not w.clean_since(LEAF, "Ethernet0", 0)  # seen once: up, but its errors not yet known to hold still
        w.saw(LEAF, [port(in_errors=0)], 2_000)
        assert w.clean_since(LEAF, "Ethernet0", 2_000)
        assert not w.clean_since(LEAF, "Ethernet0", 2_001)  # not newer than the fault
        assert not w.clean_since(LEAF, "Ethernet4", 0)  # never reported
        assert not w.clean_since("leaf-b0-r4", "Ethernet0", 0)

    @pytest.mark.parametrize(
        "latest",
        [
            port(oper="down"),
            port(in_errors=5),
            port(pfc_wd_status=["operational", "stormed"]),
            tpb.SwitchPortSample(port="Ethernet0", oper_status="up", admin_status="down"),
        ],
        ids=["oper-down", "errors-rose", "pfc-storm", "admin-down"],
    )
    def test_the_latest_report_decides_and_anything_wrong_is_not_clean(self, latest: tpb.SwitchPortSample) -> None:
        w = SwitchPortWitness()
        w.saw(LEAF, [port()], 1_000)
        w.saw(LEAF, [port()], 2_000)
        w.saw(LEAF, [latest], 3_000)
        assert not w.clean_since(LEAF, "Ethernet0", 0)

    def test_a_forgotten_switch_says_nothing(self) -> None:
        w = SwitchPortWitness()
        w.saw(LEAF, [port()], 1_000)
        w.saw(LEAF, [port()], 2_000)
        w.forget(LEAF)
        assert not w.clean_since(LEAF, "Ethernet0", 0)


def _correlator(fabric: Fabric, clock: FakeClock, witness: SwitchPortWitness) -> Correlator:
    store = IncidentStore(sqlite3.connect(":memory:", isolation_level=None))
    return Correlator(fabric, store, CorrelationConfig(), clock=clock, port_clean=witness.clean_since)


class TestTheLeafsOwnWord:
    def _fail_together(
        self, fabric: Fabric, clock: FakeClock, switch_says: str | None
    ) -> tuple[list[tuple[str, str, str]], Correlator]:
        """nic-3 of three nodes on LEAF erroring together; the leaf's agent reports before and (maybe) after."""
        witness = SwitchPortWitness()
        corr = _correlator(fabric, clock, witness)
        witness.saw(LEAF, leaf_ports(fabric), clock.time_ms() - 2_000)  # clean before the fault: no word on it
        witness.saw(LEAF, leaf_ports(fabric), clock.time_ms() - 1_000)
        corr.on_changes(opened(*(nic_errors(n, clock) for n in NODES)))
        clock.advance(0.1)
        if switch_says == "clean":
            witness.saw(LEAF, leaf_ports(fabric), clock.time_ms())
        elif switch_says == "down":
            witness.saw(LEAF, leaf_ports(fabric, oper="down"), clock.time_ms())
        elif switch_says == "errors":
            witness.saw(LEAF, leaf_ports(fabric, in_errors=40), clock.time_ms())
        return [(change, inc.kind, inc.root_cause) for change, inc in settle(corr, clock)], corr

    def test_ports_reported_up_and_clean_after_the_fault_leave_the_nics_to_blame(self, fabric, clock) -> None:
        out, corr = self._fail_together(fabric, clock, "clean")
        assert out == [("opened", "nic_fault", f"node-{n:03d}/nic-3") for n in NODES]
        for inc in corr.incidents():  # each says why the leaf was not blamed
            (opening,) = [h for h in corr.store.history(inc.id) if h["change"] == "opened"]
            assert opening["detail"]["switch_reports_clean"] == LEAF

    @pytest.mark.parametrize("switch_says", ["down", "errors", None], ids=["ports-down", "errors-rising", "no-news"])
    def test_a_leaf_that_says_otherwise_or_nothing_new_is_one_switch_incident(self, fabric, clock, switch_says) -> None:
        out, corr = self._fail_together(fabric, clock, switch_says)
        assert out == [("opened", "switch_fault", LEAF)]
        (inc,) = corr.incidents()
        assert inc.kind not in EVICTABLE_KINDS  # no node blamed, none evicted
        assert sorted(inc.affected_nodes) == [f"node-{n:03d}" for n in NODES]

    def test_without_a_switch_agent_the_leaf_is_blamed_as_before(self, fabric, clock) -> None:
        store = IncidentStore(sqlite3.connect(":memory:", isolation_level=None))
        corr = Correlator(fabric, store, CorrelationConfig(), clock=clock)
        corr.on_changes(opened(*(nic_errors(n, clock) for n in NODES)))
        assert [(c, i.kind, i.root_cause) for c, i in settle(corr, clock)] == [("opened", "switch_fault", LEAF)]


def test_detection_takes_the_switchs_word_from_its_reports(fabric, clock) -> None:
    """A switch agent's reports reach the witness the grouper asks; a compute node's never do."""
    det = Detection(
        sqlite3.connect(":memory:", isolation_level=None),
        load_rules(),
        fabric,
        ControllerMetrics(),
        clock=clock,
    )
    det.bind(lambda verdict: None)
    switch = NodeRecord(node_id=LEAF, role=ipb.NODE_ROLE_SWITCH, state=ONLINE, first_seen_ms=0, last_seen_ms=0)
    for seq in (1, 2):
        report = tpb.Report(seq=seq, timestamp_ms=clock.time_ms(), switch_ports=leaf_ports(fabric))
        det.decide(switch, spb.AgentMessage(report=report), 0.0)
        clock.advance(1.0)
    first = fabric.port_of("node-001/nic-3")
    assert first is not None
    assert det.switch_ports.clean_since(LEAF, first, clock.time_ms() - 1_000)
    det.forget(LEAF)
    assert not det.switch_ports.clean_since(LEAF, first, 0)
