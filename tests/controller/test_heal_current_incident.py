"""The healer acts on an incident as it is when it gets to it, not as it was queued.

A change waits in the healer's queue (one sweep live, longer in a simulator that works the
queue later) while the repair loop returns the node and resolves the incident. Worked off
afterwards, the stale "updated" snapshot must not evict the node again.
"""

from __future__ import annotations

from pathlib import Path

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Condition, ConditionChange
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import NodeHealState
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

NODE = "node-002"


def _hello(node: str) -> spb.Hello:
    inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)])
    return spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="boot-1")


def _fault(
    clock: FakeClock, rule: str = "gpu.xid.reboot", severity: str = "fatal", action: str = "reboot"
) -> Condition:
    """What detection holds for a fault of GPU 1 (an Xid 79 unless told)."""
    now = clock.time_ms()
    return Condition(rule=rule, component=f"{NODE}/gpu-1", component_type="gpu", category="gpu",
                     node=NODE, severity=severity, action=action, message=f"{rule} on GPU 1",  # type: ignore[arg-type]
                     first_seen_ms=now, last_seen_ms=now)  # fmt: skip


def _group_due(core: DecisionCore, clock: FakeClock) -> None:
    """Let the correlator group everything fed so far, its settle window passed on the clock."""
    correlator = core.detection.correlator
    while (due := correlator.next_due_ms()) is not None:
        if due > clock.time_ms():
            clock.set_ms(due)
        core.detection.group()
    core.detection.group()  # a resolved member updates its incident at once


async def test_a_stale_update_of_a_resolved_incident_does_not_evict_a_returned_node(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=8, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=1)
    scheduler = SimScheduler([*fabric.nodes()])
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
        heal=HealSettings(
            scheduler=scheduler,
            guards=GuardConfig(mode="enforce"),
            heal=HealConfig(checkpoint_timeout_s=0.0),
        ),
    )
    store = Store(config.db_path)
    try:
        core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
        healer = core.healer
        assert healer is not None and healer.repairs is not None
        for node in fabric.nodes():
            core.hello(_hello(node))
        fault = _fault(clock)
        core.feed([ConditionChange("opened", fault)])
        _group_due(core, clock)
        assert await healer.work_queued() >= 1
        assert healer.store.state(NODE) == NodeHealState.EVICTED
        drains = [a for a in scheduler.actions if a[0] == "drain" and a[1] == NODE]
        assert len(drains) == 1
        (incident,) = core.open_incidents()

        # The same GPU reports a double-bit ECC error too and it joins the incident: an update the healer has
        # not got to yet (one sweep live, later in a simulator that works its queue in steps).
        clock.advance(60.0)
        second = _fault(clock, "gpu.ecc_dbe", "critical", "reset_gpu")
        core.feed([ConditionChange("opened", second)])
        _group_due(core, clock)
        assert [i.id for i in list(healer._queue._queue)] == [incident.id]  # type: ignore[attr-defined]

        # Both faults clear.
        clock.advance(300.0)
        for c in (fault, second):
            c.resolved_ms = clock.time_ms()
        core.feed([ConditionChange("resolved", c) for c in (fault, second)])
        _group_due(core, clock)

        # Meanwhile the repair validated: the node is back and the incident resolved.
        clock.advance(300.0)
        assert await healer.repairs.finish(NODE, "repaired and validated")
        assert healer.store.state(NODE) == NodeHealState.IN_SERVICE
        now = core.detection.correlator.get(incident.id)
        assert now is not None and not now.active

        # The queued update is worked off now: the node stays at work, no second drain.
        await healer.work_queued()
        assert healer.store.state(NODE) == NodeHealState.IN_SERVICE
        assert [a for a in scheduler.actions if a[0] == "drain" and a[1] == NODE] == drains
        assert [e.node for e in healer.evictions if not e.dry_run] == [NODE]
    finally:
        store.close()
