"""End to end over loopback: simulated agents stream to a real controller (in-process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.findings import event_kind_name
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.helpers import free_port, make_sim_agent, wait_for


def _controller(tmp_path: Path, port: int, **kw: object) -> Controller:
    return Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
            **kw,  # type: ignore[arg-type]
        ),
        clock=SYSTEM_CLOCK,
    )


class TestStreaming:
    async def test_agents_register_report_and_deliver_faults(self, tmp_path: Path) -> None:
        """Three agents register their inventory, stream reports, and an injected Xid arrives with its action."""
        port = free_port()
        ctl = _controller(tmp_path, port)
        await ctl.start()
        agents = [make_sim_agent(f"node-{i:03d}", tmp_path, [f"127.0.0.1:{port}"], seed=i) for i in range(3)]
        try:
            for a in agents:
                a.start()
            reg = ctl.registry
            await wait_for(
                lambda: all(
                    n in reg.nodes and reg.nodes[n].latest_report is not None
                    for n in ("node-000", "node-001", "node-002")
                ),
                what="three nodes reporting",
            )
            node = reg.nodes["node-001"]
            assert len(node.inventory.gpus) == 8
            assert len(node.inventory.nics) == 9  # 8 rails + the bond
            report = node.latest_report
            assert report is not None and len(report.gpus) == 8 and len(report.nics) == 9
            assert report.gpus[0].HasField("power_w") and report.gpus[0].power_w > 100

            agents[1].sim.inject("gpu_xid", "gpu-2", xid=79)
            await wait_for(lambda: ctl.store.count_events("node-001") >= 1, what="the Xid event")
            rows = ctl.store.list_events("node-001")
            xids = [r.event for r in rows if event_kind_name(r.event.kind) == "xid"]
            assert xids and xids[0].xid == 79 and xids[0].action == "reboot"
            assert xids[0].component == "gpu-2"
            # NVML's event and the kernel-log line are one fault: one event, not two.
            await asyncio.sleep(1.0)
            assert len([r for r in ctl.store.list_events("node-001") if r.event.xid == 79]) == 1
        finally:
            for a in agents:
                await a.halt()
            await ctl.stop()

    async def test_nic_down_is_an_event_and_heartbeat_loss_marks_unreachable(self, tmp_path: Path) -> None:
        """A NIC going down becomes an event; an agent that goes silent becomes unreachable, then online again."""
        port = free_port()
        ctl = _controller(tmp_path, port, heartbeat_timeout_s=1.0)
        await ctl.start()
        a = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{port}"])
        try:
            a.start()
            await wait_for(lambda: "node-000" in ctl.registry.nodes, what="registration")
            a.sim.inject("nic_down", "nic-3")
            await wait_for(
                lambda: any(event_kind_name(r.event.kind) == "nic_link_down" for r in ctl.store.list_events()),
                what="nic_link_down",
            )
            a.agent.link.set_blocked(True)  # the management network goes away
            await wait_for(lambda: ctl.registry.nodes["node-000"].state == "unreachable", what="unreachable")
            a.agent.link.set_blocked(False)
            await wait_for(lambda: ctl.registry.nodes["node-000"].state == "online", what="back online")
        finally:
            await a.halt()
            await ctl.stop()


class TestNoLossNoDuplicates:
    async def test_controller_restart_mid_stream_loses_and_duplicates_nothing(self, tmp_path: Path) -> None:
        """Events emitted while the controller restarts twice all arrive exactly once, in order."""
        port = free_port()
        ctl = _controller(tmp_path, port)
        await ctl.start()
        agents = [make_sim_agent(f"node-{i:03d}", tmp_path, [f"127.0.0.1:{port}"], seed=i) for i in range(2)]
        for a in agents:
            a.start()
        await wait_for(lambda: len(ctl.registry.nodes) == 2, what="registration")

        async def fire(count: int) -> None:
            for _ in range(count):
                for a in agents:
                    # distinct Xids (unknown ones are "investigate") so storm suppression keeps them all
                    a.sim.kmsg.xid("0000:0b:00", 1000 + int(a.sim.kmsg.next_seq), "test burst")
                await asyncio.sleep(0.02)

        try:
            await fire(20)
            await ctl.stop()  # controller goes away mid-stream
            await fire(20)  # the agents keep finding things
            ctl = _controller(tmp_path, port)
            await ctl.start()
            await fire(20)
            await ctl.stop()
            ctl = _controller(tmp_path, port)
            await ctl.start()
            await fire(10)
            for a in agents:
                await wait_for(
                    lambda a=a: (
                        a.agent.events_emitted == 70
                        and ctl.registry.nodes.get(a.agent.config.node_id) is not None
                        and ctl.registry.nodes[a.agent.config.node_id].acked_event_seq == a.agent.buffer.next_seq - 1
                    ),
                    what="all events acked",
                )
            for a in agents:
                node_id = a.agent.config.node_id
                stored = ctl.store.list_events(node_id, limit=10_000)
                seqs = sorted(r.event.seq for r in stored)
                assert a.agent.events_emitted == 70
                assert seqs == list(range(1, 71)), f"{node_id}: lost or duplicated events"
                assert a.agent.buffer.depth() == 0
        finally:
            for a in agents:
                await a.halt()
            await ctl.stop()

    async def test_agent_restart_replays_unacked_events(self, tmp_path: Path) -> None:
        """Events buffered while the agent could not reach the controller survive an agent restart."""
        port = free_port()
        ctl = _controller(tmp_path, port)
        a = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{port}"])
        a.start()  # no controller yet: events wait on disk
        await wait_for(lambda: a.agent.cycles >= 1, what="first cycle")
        for i in range(15):
            a.sim.kmsg.xid("0000:13:00", 2000 + i, "before restart")
        await wait_for(lambda: a.agent.events_emitted == 15, what="15 events buffered")
        await a.halt()
        assert a.agent.events_emitted == 15

        await ctl.start()
        b = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{port}"], sim=a.sim)
        b.start()
        try:
            for i in range(5):
                a.sim.kmsg.xid("0000:13:00", 3000 + i, "after restart")
            await wait_for(lambda: ctl.store.count_events("node-000") == 20, what="20 events stored")
            await asyncio.sleep(0.5)
            seqs = sorted(r.event.seq for r in ctl.store.list_events("node-000", limit=100))
            assert seqs == list(range(1, 21))
        finally:
            await b.halt()
            await ctl.stop()


class TestServiceSurface:
    async def test_health_metrics_healthz_and_query(self, tmp_path: Path) -> None:
        """gRPC health says SERVING, /metrics counts reports, /healthz is ok, ListNodes lists the node."""
        port = free_port()
        ctl = _controller(tmp_path, port)
        await ctl.start()
        a = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{port}"])
        a.start()
        try:
            await wait_for(lambda: ctl.metrics.reports._value.get() >= 2, what="two reports")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                nodes = await sgrpc.QueryStub(ch).ListNodes(spb.ListNodesRequest())
                assert [n.node_id for n in nodes.nodes] == ["node-000"]
                assert nodes.nodes[0].state == "online" and nodes.nodes[0].gpu_count == 8
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{ctl.http_port}"
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                    assert "starpulse_reports_received_total" in text
                    assert 'starpulse_nodes{state="online"} 1.0' in text
        finally:
            await a.halt()
            await ctl.stop()
