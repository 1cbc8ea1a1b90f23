"""Conditions on a generated fabric and a correlator on a fake clock, to group them into incidents."""

from __future__ import annotations

import sqlite3

import pytest

from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.incidents import IncidentStore
from controller.detect.model import Condition, ConditionChange, Incident
from controller.fabric import Fabric, generate_fabric
from starpulse.core.clock import FakeClock


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return generate_fabric(nodes=32, rails=8, nodes_per_block=16, spines=8)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


def node(i: int, width: int = 3) -> str:
    return f"node-{i:0{width}d}"


def nic_down(n: int, rail: int, clock: FakeClock, severity: str = "critical", width: int = 3) -> Condition:
    return Condition(
        rule="nic_link_down",
        component=f"{node(n, width)}/nic-{rail}",
        component_type="nic",
        category="nic_link",
        node=node(n, width),
        severity=severity,  # type: ignore[arg-type]
        action="check_link",
        message="port down",
        first_seen_ms=clock.time_ms(),
        last_seen_ms=clock.time_ms(),
    )


def gpu_xid(n: int, gpu: int, clock: FakeClock, width: int = 3) -> Condition:
    return Condition(
        rule="xid_79",
        component=f"{node(n, width)}/gpu-{gpu}",
        component_type="gpu",
        category="gpu",
        node=node(n, width),
        severity="fatal",
        action="reboot",
        message="Xid 79: GPU has fallen off the bus",
        first_seen_ms=clock.time_ms(),
        last_seen_ms=clock.time_ms(),
        evidence={"xid": 79},
    )


def heartbeat(n: int, clock: FakeClock, width: int = 3) -> Condition:
    return Condition(
        rule="heartbeat_lost",
        component=node(n, width),
        component_type="node",
        category="heartbeat",
        node=node(n, width),
        severity="critical",
        action="investigate",
        message="no report for 30s",
        first_seen_ms=clock.time_ms(),
        last_seen_ms=clock.time_ms(),
    )


def opened(*conds: Condition) -> list[ConditionChange]:
    return [ConditionChange("opened", c) for c in conds]


def settle(corr: Correlator, clock: FakeClock) -> list[tuple[str, Incident]]:
    clock.advance(corr.config.settle_s)
    return corr.tick()


def opened_incidents(changes: list[ConditionChange], clock: FakeClock) -> list[Incident]:
    """The incidents a correlator (in-memory store) opens for ``changes`` once they settle."""
    corr = Correlator(
        None,
        IncidentStore(sqlite3.connect(":memory:", isolation_level=None)),
        CorrelationConfig(settle_s=2.0, resolve_hold_s=60.0),
        clock=clock,
    )
    corr.on_changes(changes)
    clock.advance(3)
    return [inc for change, inc in corr.tick() if change == "opened"]
