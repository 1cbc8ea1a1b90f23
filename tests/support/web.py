"""A controller without agents on a declared fabric, its web API served on loopback, and conditions fed in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Condition, ConditionChange
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, generate_fabric
from controller.outputs.http import build_app
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

Client = TestClient[web.Request, web.Application]


def make_controller(tmp_path: Path, fabric: Fabric | None, clock: Clock) -> Controller:
    return Controller(
        ControllerConfig(
            db_path=tmp_path / "controller.db",
            fabric=fabric,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=0, resolve_hold_s=0)),
        ),
        clock=clock,
    )


def register(ctl: Controller, name: str, role: int = ipb.NODE_ROLE_COMPUTE, gpus: int = 8) -> None:
    inv = ipb.Inventory(gpus=[ipb.GpuInfo() for _ in range(gpus)])
    ctl.registry.register(spb.Hello(node_id=name, role=role, inventory=inv, buffer_epoch="e1"))


def cond(
    component: str,
    rule: str,
    category: str,
    component_type: str,
    node: str | None,
    severity: str = "critical",
) -> Condition:
    t = SYSTEM_CLOCK.time_ms()
    return Condition(
        rule=rule,
        component=component,
        component_type=component_type,  # type: ignore[arg-type]
        category=category,
        node=node,
        severity=severity,  # type: ignore[arg-type]
        action="check_link",
        message=f"{rule} on {component}",
        first_seen_ms=t,
        last_seen_ms=t,
    )


def nic_down(node: str, rail: int) -> Condition:
    return cond(f"{node}/nic-{rail}", "nic_link_down", "nic_link", "nic", node)


def gpu_xid(node: str, gpu: int) -> Condition:
    return cond(f"{node}/gpu-{gpu}", "xid_79", "gpu", "gpu", node, severity="fatal")


def feed(ctl: Controller, *conditions: Condition, kind: str = "opened") -> None:
    ctl.detection.correlator.on_changes([ConditionChange(kind, c) for c in conditions])  # type: ignore[arg-type]
    ctl.detection.tick()


@pytest.fixture
def fabric() -> Fabric:
    """8 regular nodes + 1 spare: 3 blocks of 4 (the last one has only the spare), 4 rails, 2 spines."""
    return generate_fabric(nodes=8, gpus_per_node=8, rails=4, nodes_per_block=4, spines=2, spares=1)


@pytest.fixture
async def ctl(tmp_path: Path, fabric: Fabric) -> AsyncIterator[Controller]:
    controller = make_controller(tmp_path, fabric, SYSTEM_CLOCK)
    yield controller
    controller.store.close()


async def serve(ctl: Controller, **kw: Any) -> Client:
    app = build_app(ctl.registry, ctl.store, ctl.metrics, healthy=lambda: True, queries=ctl.queries, **kw)
    client: Client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(ctl: Controller) -> AsyncIterator[Client]:
    c = await serve(ctl, poll_s=0.05)
    yield c
    await c.close()


async def get_json(client: Client, path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    return await resp.json()
