"""Degraded but working links alert and never evict: a narrowed or slowed PCIe link, a
retraining RDMA port. The GPU still computes and the port still passes traffic; the part is
seen to at a service window (action ``check_hardware``), the job keeps its node."""

from __future__ import annotations

from pathlib import Path

from controller.detect.model import ConditionChange, Incident
from controller.heal.policy import ALERT_ONLY, load_policy
from tests.support.conditions import NODE, compute_node, good_report, make_engine
from tests.support.conditions import pcie_link as _pcie_link
from tests.support.correlate import opened_incidents
from tests.support.heal import make_healer as _healer


def _incidents(mutate) -> list[Incident]:  # type: ignore[no-untyped-def]
    """The incidents that open for NODE when its reports show ``mutate``'s state."""
    engine, clock = make_engine()
    node = compute_node()
    changes: list[ConditionChange] = []
    for _ in range(2):
        r = good_report(clock.time_ms())
        mutate(r)
        changes += engine.on_report(node, r)
        clock.advance(20)
    return opened_incidents(changes, clock)


def _retraining(r) -> None:  # type: ignore[no-untyped-def]
    r.nics[2].phys_state_code = 6  # LinkErrorRecovery, the port still ACTIVE


async def test_a_narrowed_pcie_link_alerts_and_plans_no_drain(tmp_path: Path) -> None:
    """x8 on an x16 GPU: a gpu_fault incident opens (so the alert goes out), and the healer
    decides alert_only: no drain, no requeue, no eviction."""
    incidents = _incidents(_pcie_link(width=8))
    assert [(i.kind, i.root_cause, i.severity, i.action) for i in incidents] == [
        ("gpu_fault", f"{NODE}/gpu-5", "warning", "check_hardware")
    ]
    inc = incidents[0]
    inc.affected_nodes = ["node-002"]  # the healer's fabric names its nodes node-000..007
    inc.root_cause = "node-002/gpu-5"
    healer, sched, _ = _healer(tmp_path)
    await healer.handle(inc)
    assert sched.actions == [] and healer.evictions == []
    assert healer.decisions[-1]["outcome"] == "alert_only"


def test_a_slowed_pcie_link_and_a_retraining_port_alert_only() -> None:
    policy = load_policy()
    for mutate, kind in ((_pcie_link(gen=3), "gpu_fault"), (_retraining, "nic_fault")):
        incidents = _incidents(mutate)
        assert [(i.kind, i.action) for i in incidents] == [(kind, "check_hardware")]
        assert policy.decide(incidents[0]).action == ALERT_ONLY


def test_a_down_port_still_evicts() -> None:
    """The control: a port that is not ACTIVE is a NIC fault the policy acts on."""

    def down(r) -> None:  # type: ignore[no-untyped-def]
        r.nics[2].state, r.nics[2].state_code = "DOWN", 1

    incidents = _incidents(down)
    assert [i.kind for i in incidents] == ["nic_fault"]
    assert load_policy().decide(incidents[0]).action != ALERT_ONLY


def test_scan_keeps_a_node_with_a_narrowed_link_in_service() -> None:
    """`starpulse scan` judges with the same rules: the condition shows, the node is healthy;
    a port down on the same node is not."""
    from starpulse.app.nodecheck import judge

    node = compute_node()
    reports = []
    for ts in (1_700_000_000_000, 1_700_000_002_000):
        r = good_report(ts)
        _pcie_link(width=8)(r)
        reports.append(r)
    verdict = judge(NODE, node.inventory, reports, [])
    assert [(c.rule, c.action) for c in verdict.conditions] == [("gpu.pcie_link_narrow", "check_hardware")]
    assert verdict.status == "healthy" and verdict.exit_code == 0
    reports[-1].nics[2].state, reports[-1].nics[2].state_code = "DOWN", 1
    assert judge(NODE, node.inventory, reports, []).exit_code == 1
