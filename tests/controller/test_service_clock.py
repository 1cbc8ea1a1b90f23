"""The controller's one clock: the service hands the same Clock to every part, and a fake one
drives the real decision code (sweep loop, presence, detection, correlation) with no real time passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.scheduler.sim import SimScheduler
from controller.ingest.registry import ONLINE, UNREACHABLE
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb


def test_the_service_hands_one_clock_to_every_part(tmp_path: Path) -> None:
    """Every part that reads the time or waits holds the very clock the Controller was given."""
    fabric = generate_fabric(nodes=8, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=1)
    clock = FakeClock()
    ctl = Controller(
        ControllerConfig(
            db_path=tmp_path / "c.db", fabric=fabric, heal=HealSettings(scheduler=SimScheduler([*fabric.nodes()]))
        ),
        clock=clock,
    )
    try:
        healer = ctl.healer
        assert healer is not None and healer.spares is not None
        parts = {
            "controller": ctl,
            "registry": ctl.registry,
            "jobs": ctl.jobs,
            "detection": ctl.detection,
            "condition engine": ctl.detection.engine,
            "fail-slow": ctl.detection.failslow,
            "correlator": ctl.detection.correlator,
            "topology": ctl.detection.topology,
            "notifier": ctl.notifier,
            "outbox": ctl.notifier.outbox,
            "healer": healer,
            "remediation store (and spares)": healer.spares.store,
            "guards": healer.guards,
            "breaker": healer.guards.breaker,
            "heal history": healer.history,
        }
        assert {name: getattr(part, "clock", None) is clock for name, part in parts.items()} == dict.fromkeys(
            parts, True
        )
        assert healer.store is healer.spares.store
    finally:
        ctl.store.close()


def test_the_clock_is_required_and_the_system_clock_reaches_every_part(tmp_path: Path) -> None:
    """No default clock: a caller that forgets it fails at once instead of running on real time unnoticed."""
    with pytest.raises(TypeError, match="clock"):
        Controller(ControllerConfig(db_path=tmp_path / "none.db"))  # type: ignore[call-arg]
    ctl = Controller(ControllerConfig(db_path=tmp_path / "c.db"), clock=SYSTEM_CLOCK)
    try:
        assert ctl.clock is SYSTEM_CLOCK
        assert ctl.registry.clock is ctl.detection.correlator.clock is ctl.notifier.clock is SYSTEM_CLOCK
    finally:
        ctl.store.close()


async def test_a_silent_node_becomes_an_incident_on_the_fake_clock_alone(tmp_path: Path) -> None:
    """The running service's sweep loop, presence, detection and correlation, driven by advancing a fake clock.

    Half a minute passes on the fake clock and none to speak of in real time, so the node can only
    have gone unreachable, and its incident opened, on the fake clock: the fake clock starts years
    before today, so a stamp read from the system clock would lie outside the window asserted.
    """
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
        heartbeat_timeout_s=15.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
    )
    ctl = Controller(config, clock=clock)
    nodes = [
        ctl.registry.register(spb.Hello(node_id=f"node-{i:03d}", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
        for i in range(10)
    ]
    await ctl.start()
    try:
        started_ms = clock.time_ms()
        for second in range(30):  # every node but node-003 is heard once a (simulated) second
            for node in nodes:
                if node.node_id != "node-003":
                    ctl.registry.touch(node)
            if second == 10:
                assert ctl.registry.nodes["node-003"].state == ONLINE  # 10 s silent: within the timeout
            await clock.run_for(1.0)
        states = {n: r.state for n, r in ctl.registry.nodes.items()}
        assert states == {n.node_id: UNREACHABLE if n.node_id == "node-003" else ONLINE for n in nodes}
        incidents = ctl.detection.correlator.incidents(active_only=True)
        assert [(i.kind, i.affected_nodes) for i in incidents] == [("node_down", ["node-003"])]
        assert clock.time_ms() == started_ms + 30_000
        # stamped on the fake clock, once node-003's 15 s heartbeat timeout had passed on it
        assert started_ms + 15_000 <= incidents[0].opened_ms <= clock.time_ms()
    finally:
        await ctl.stop()
