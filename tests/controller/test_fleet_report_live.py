"""The fleet report from a controller's own run: a fault injected, detected, healed, reported.

The decision core on a FakeClock takes an Xid 79, evicts the node, reboots and validates it
and returns it; the report computed from what the run wrote gives one GPU fault, the node's
time out of the pool as the controller measured it, and the GPU-days of the fleet its sweep
recorded. Then the real service answers GetFleetReport over loopback gRPC and serves the
figures on /metrics.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import grpc
import pytest

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.inservice import service_intervals
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import NodeHealState
from controller.metrics import ControllerMetrics
from controller.query.fleet import fleet_report
from controller.service import Controller
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port
from tests.support.metrics import one

NODE = "node-002"
GPUS = 2


def _hello(node: str, boot: int) -> spb.Hello:
    inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(GPUS)])
    return spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id=f"boot-{boot}")


async def _agent(core: DecisionCore) -> None:
    """The node's end of the stream: a reboot is answered by a hello with a new boot id."""
    boot = 1
    while True:
        command = await core.registry.nodes[NODE].commands.get()
        if command.kind == spb.COMMAND_KIND_REBOOT:
            boot += 1
            core.hello(_hello(NODE, boot))
        else:
            core.registry.command_result(core.registry.nodes[NODE], spb.CommandResult(id=command.id, ok=True))


async def test_a_healed_fault_is_counted_with_the_time_the_node_was_out(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=8, gpus_per_node=GPUS, rails=2, nodes_per_block=4, spines=1, spares=1)
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
        heal=HealSettings(
            scheduler=SimScheduler([*fabric.nodes()]),
            guards=GuardConfig(mode="enforce"),
            heal=HealConfig(checkpoint_timeout_s=0.0, repair_poll_s=1.0),
        ),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
    assert core.healer is not None
    start_ms = clock.time_ms()
    for node in fabric.nodes():
        core.hello(_hello(node, 1))
    core.start()
    agent = asyncio.create_task(_agent(core))
    try:
        await clock.run_for(1.0)
        assert {i.node for i in service_intervals(store.connection, start_ms, start_ms + 1)} == set(fabric.nodes())
        xid = tpb.Event(seq=1, timestamp_ms=clock.time_ms(), kind=tpb.EVENT_KIND_XID,
                        severity=tpb.SEVERITY_CRITICAL, component="gpu-1", xid=79, source="kmsg",
                        message="NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.")  # fmt: skip
        core.events(NODE, [xid])
        await clock.run_for(10.0)
        for _ in range(20 * 60):
            for node in fabric.nodes():
                core.report(node, tpb.Report(seq=1, timestamp_ms=clock.time_ms()))
            await clock.run_for(1.0)
            if core.healer.store.state(NODE) == NodeHealState.IN_SERVICE:
                break
        assert core.healer.store.state(NODE) == NodeHealState.IN_SERVICE
        await clock.run_for(3600.0)
    finally:
        agent.cancel()
        await core.stop()
        await core.stop_healing()
    until = clock.time_ms()
    (incident,) = core.detection.correlator.incidents(active_only=False)
    back = max(t.at_ms for t in core.healer.store.history(NODE) if t.to_state == NodeHealState.IN_SERVICE)
    report = fleet_report(store.connection, start_ms, until)
    store.close()
    assert (report.faults, report.by_cause) == (1, {"gpu": 1})
    assert report.mttr_pool_s == [(back - incident.opened_ms) / 1000.0]
    assert report.evictions == 1
    nodes = len(fabric.nodes())
    assert report.node_days == pytest.approx(nodes * (until - start_ms) / 86_400_000)
    assert report.gpu_days == pytest.approx(GPUS * report.node_days)
    assert report.to_dict()["faults"]["per_1000_gpu_days"] == pytest.approx(1000 / report.gpu_days)


async def test_get_fleet_report_over_grpc_and_the_metrics(tmp_path: Path) -> None:
    """The Query service answers the report; a bad window is refused; /metrics carries the figures."""
    ctl = Controller(
        ControllerConfig(listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db"),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    try:
        ctl.registry.register(_hello("node-001", 1))
        ctl.core.sync_fleet_service()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ctl.grpc_port}") as channel:
            stub = sgrpc.QueryStub(channel)
            resp = await stub.GetFleetReport(spb.FleetReportRequest(since_s=3600))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetFleetReport(spb.FleetReportRequest(since_s=1000 * 86400))
        body = json.loads(resp.report_json)
        assert body["fleet"]["nodes_in_service"] == 1 and body["fleet"]["gpus_in_service"] == GPUS
        assert (resp.faults, body["faults"]["total"]) == (0, 0)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        url = f"http://127.0.0.1:{ctl.http_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as http:
            text = await http.text()
        assert one(text, "starpulse_fleet_fault_rate", cause="all") == 0.0
        assert one(text, "starpulse_fleet_gpu_seconds") > 0
        assert one(text, "starpulse_fleet_lemon_nodes") == 0
    finally:
        await ctl.stop()
