"""The repair lifecycle as every surface shows it: /api/nodes (and its filter), /api/summary,
/api/fabric, /metrics, the change signature and the breaker chip, all from the one SQLite row.

No agents: nodes are registered with Hello messages and lifecycle rows are written through
the real ``RemediationStore`` on the controller's own connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controller.fabric import Fabric, generate_fabric
from controller.heal.guards import BreakerState
from controller.heal.states import NodeHealState, RemediationStore, lifecycle_counts, parse_states
from controller.outputs.http import build_app
from controller.outputs.web.api import DashboardState, breaker_json
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.core.units import format_duration
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

S = NodeHealState
Client = TestClient[web.Request, web.Application]


@pytest.fixture
def fabric() -> Fabric:
    return generate_fabric(nodes=6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=1, spares=1)


@pytest.fixture
async def ctl(tmp_path: Path, fabric: Fabric) -> AsyncIterator[Controller]:
    controller = Controller(ControllerConfig(db_path=tmp_path / "c.db", fabric=fabric), clock=FakeClock(1_000_000))
    for name in fabric.nodes():
        inv = ipb.Inventory(gpus=[ipb.GpuInfo() for _ in range(8)])
        controller.registry.register(spb.Hello(node_id=name, role=ipb.NODE_ROLE_COMPUTE, inventory=inv))
    yield controller
    controller.store.close()


@pytest.fixture
async def client(ctl: Controller) -> AsyncIterator[Client]:
    c: Client = TestClient(
        TestServer(build_app(ctl.registry, ctl.store, ctl.metrics, healthy=lambda: True, queries=ctl.queries))
    )
    await c.start_server()
    yield c
    await c.close()


def walk(ctl: Controller, node: str, *states: S, reason: str = "gpu_fault node/gpu-1 (inc-1)") -> RemediationStore:
    store = RemediationStore(ctl.store.connection, ctl.clock)
    for st in states:
        store.transition(node, st, f"{reason}: {st}", "inc-1")
    return store


async def get(client: Client, path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_api_nodes_shows_lifecycle_with_since_and_why_and_filters(ctl: Controller, client: Client) -> None:
    walk(ctl, "node-001", S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING)
    walk(ctl, "node-002", S.CORDONED)
    body = await get(client, "/api/nodes")
    rows = {n["node_id"]: n for n in body["nodes"]}
    assert rows["node-001"]["state"] == "online"  # presence stays presence
    assert rows["node-001"]["lifecycle_state"] == "repairing"
    assert rows["node-001"]["lifecycle_reason"].endswith(": repairing")
    assert int(rows["node-001"]["lifecycle_since_ms"]) == ctl.clock.time_ms()
    assert rows["node-001"]["drained_by"] == "starpulse" and rows["node-001"]["incident_id"] == "inc-1"
    assert rows["node-003"]["lifecycle_state"] == "in_service" and rows["node-003"]["lifecycle_reason"] == ""
    only = await get(client, "/api/nodes?state=repairing,cordoned")
    assert [n["node_id"] for n in only["nodes"]] == ["node-001", "node-002"]
    bad = await get(client, "/api/nodes?state=broken", status=400)
    assert "unknown lifecycle state 'broken'" in bad["error"] and "validating" in bad["error"]


async def test_summary_and_fabric_colour_by_lifecycle(ctl: Controller, client: Client, fabric: Fabric) -> None:
    walk(ctl, "node-001", S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING)
    walk(ctl, "node-004", S.CORDONED, S.DRAINING, S.EVICTED, S.RETIRED)
    summary = await get(client, "/api/summary")
    total = len(fabric.nodes())
    assert summary["lifecycle"]["validating"] == 1 and summary["lifecycle"]["retired"] == 1
    assert summary["lifecycle"]["in_service"] == total - 2 and sum(summary["lifecycle"].values()) == total
    body = await get(client, "/api/fabric")
    nodes = {n["name"]: n for b in body["blocks"] for n in b["nodes"]}
    assert nodes["node-001"]["lifecycle"] == "validating" and nodes["node-004"]["lifecycle"] == "retired"
    assert nodes["node-002"]["lifecycle"] == "in_service"


async def test_metrics_count_nodes_per_lifecycle_state(ctl: Controller, client: Client, fabric: Fabric) -> None:
    walk(ctl, "node-001", S.CORDONED, S.DRAINING)
    walk(ctl, "node-002", S.CORDONED, S.DRAINING)
    text = await (await client.get("/metrics")).text()
    assert 'starpulse_node_lifecycle{state="draining"} 2.0' in text
    assert f'starpulse_node_lifecycle{{state="in_service"}} {len(fabric.nodes()) - 2}.0' in text
    assert 'starpulse_node_lifecycle{state="spare"} 0.0' in text


def test_lifecycle_change_moves_the_dashboard_signature(ctl: Controller) -> None:
    from controller.heal.states import lifecycle_records

    state = DashboardState(ctl.registry, ctl.queries, lifecycle=lambda: lifecycle_records(ctl.store.connection))
    first = state.signature()
    assert state.signature() == first
    walk(ctl, "node-003", S.CORDONED)
    assert state.signature() != first


def test_counts_and_filter_words() -> None:
    import sqlite3

    conn = sqlite3.connect(":memory:", isolation_level=None)
    assert lifecycle_counts(conn, 5)[S.IN_SERVICE] == 5  # no table yet: everyone in service
    store = RemediationStore(conn, FakeClock(0))
    store.transition("a", S.CORDONED, "r", "i")
    counts = lifecycle_counts(conn, 5)
    assert counts[S.CORDONED] == 1 and counts[S.IN_SERVICE] == 4
    assert parse_states(["Repairing", "in-service"]) == {S.REPAIRING, S.IN_SERVICE}
    with pytest.raises(ValueError, match="unknown lifecycle state 'fixed'"):
        parse_states(["fixed"])


def test_breaker_chip_reads_the_real_breaker_in_words() -> None:
    now = SYSTEM_CLOCK.time_ms()
    opened = breaker_json(BreakerState(True, now - 300_000, "9 of 16 nodes faulty within 10 min", None, None), now)
    assert opened == {
        "state": "open",
        "reason": "9 of 16 nodes faulty within 10 min",
        "opened_ms": now - 300_000,
        "open_for": "5 min",
    }
    closed = breaker_json(BreakerState(False, now - 9_000_000, "x", "alice", now - 7_200_000), now)
    assert closed["state"] == "closed" and closed["closed_by"] == "alice" and closed["closed_ago"] == "2 h"
    assert [format_duration(s) for s in (0.25, 45, 600, 7_500, 200_000)] == [
        "250 ms",
        "45 s",
        "10 min",
        "2 h 5 min",
        "2 d 7 h",
    ]


async def test_controller_with_healing_serves_its_breaker_on_the_chip(tmp_path: Path) -> None:
    from controller.heal.scheduler.sim import SimScheduler
    from controller.service import HealSettings

    heal = HealSettings(scheduler=SimScheduler())
    ctl = Controller(
        ControllerConfig(db_path=tmp_path / "c.db", http="127.0.0.1:0", listen="127.0.0.1:0", heal=heal),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    try:
        assert ctl.healer is not None
        ctl.healer.guards.breaker.trip("3 evictable incidents within 10 min (trip at 3)")
        import aiohttp

        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{ctl.http_port}/api/summary") as r:
            breaker = (await r.json())["breaker"]
        assert breaker["available"] is True and breaker["state"] == "open"
        assert breaker["reason"].startswith("3 evictable incidents") and "open_for" in breaker
    finally:
        await ctl.stop()


async def test_nodes_command_shows_and_filters_lifecycle(tmp_path: Path, fabric: Fabric) -> None:
    """``starpulse nodes`` as a person runs it, against a controller serving real gRPC."""
    import asyncio
    import json
    import os
    import sys

    ctl = Controller(
        ControllerConfig(db_path=tmp_path / "c.db", fabric=fabric, http="127.0.0.1:0", listen="127.0.0.1:0"),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()

    async def cli(*args: str) -> tuple[int, str, str]:
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "starpulse.app.cli", "nodes", "--controller", f"127.0.0.1:{ctl.grpc_port}", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    try:
        for name in ("node-000", "node-001", "node-002"):
            ctl.registry.register(spb.Hello(node_id=name, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory()))
        walk(ctl, "node-001", S.CORDONED, S.DRAINING, reason="xid 79 on gpu-3")
        rc, out, err = await cli("--state", "draining", "--json")
        assert rc == 0, err
        rows = json.loads(out)["nodes"]
        assert [r["node_id"] for r in rows] == ["node-001"] and rows[0][
            "lifecycle_reason"
        ] == "xid 79 on gpu-3: draining"
        rc, out, err = await cli()
        assert rc == 0, err
        line = next(x for x in out.splitlines() if x.startswith("node-001"))
        assert "draining" in line and "xid 79 on gpu-3" in line and "[by starpulse]" in line
        assert "in_service" in next(x for x in out.splitlines() if x.startswith("node-000"))
        rc, out, err = await cli("--state", "fixed")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "'fixed' is not a lifecycle state" in err
    finally:
        await ctl.stop()


async def test_spare_pool_on_the_dashboard_and_metrics(tmp_path: Path, fabric: Fabric) -> None:
    import aiohttp

    from controller.heal.scheduler.sim import SimScheduler
    from controller.service import HealSettings

    heal = HealSettings(scheduler=SimScheduler(list(fabric.nodes())))
    config = ControllerConfig(db_path=tmp_path / "c.db", fabric=fabric, http="127.0.0.1:0", listen="127.0.0.1:0",
                              heal=heal)  # fmt: skip
    ctl = Controller(config, clock=SYSTEM_CLOCK)
    await ctl.start()
    try:
        (spare,) = fabric.spares()
        base = f"http://127.0.0.1:{ctl.http_port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/api/summary") as r:
                assert (await r.json())["spares"] == {"available": 0, "allocated": 0, "unavailable": 1, "target": 1}
            ctl.registry.register(spb.Hello(node_id=spare, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory()))
            async with s.get(f"{base}/api/summary") as r:
                assert (await r.json())["spares"]["available"] == 1  # its agent is heard: healthy
            async with s.get(f"{base}/metrics") as r:
                text = await r.text()
        assert 'starpulse_spares{state="available"} 1.0' in text and "starpulse_spare_pool_target 1.0" in text
    finally:
        await ctl.stop()
