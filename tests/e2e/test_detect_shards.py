"""Detection shards (`controller --detect-workers N`): compute nodes' reports decided in worker processes.

A controller with shards must detect, ack and refuse exactly as one without: faults from
reports and from events become incidents, acks reach agents direct and relayed, an invalid
report found by a shard ends that stream alone, and a shard that dies stops the
controller instead of leaving some nodes silently unwatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.detect.model import Condition
from controller.detect.pipeline import DetectionConfig
from controller.detect.shards import DetectShards, ShardLost
from controller.service import Controller, ControllerConfig
from controller.stages import STAGES
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.e2e.test_alerting import receiving
from tests.e2e.test_fault_to_alert import two_nodes_and_a_webhook
from tests.helpers import free_port, halt_agents, make_relay, make_sim_agent, wait_for


def _controller(tmp_path: Path, port: int, workers: int = 2) -> Controller:
    return Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
            detection=DetectionConfig(workers=workers),
        ),
        clock=SYSTEM_CLOCK,
    )


@contextlib.asynccontextmanager
async def _serving_with_one_shard(
    tmp_path: Path,
) -> AsyncIterator[tuple[Controller, DetectShards, asyncio.Event, asyncio.Task[None]]]:
    """A controller serving (serve_forever) with one shard; stopped, or its task cancelled, after."""
    ctl = _controller(tmp_path, free_port(), workers=1)
    stop = asyncio.Event()
    serving = asyncio.create_task(ctl.serve_forever(stop))
    try:
        await wait_for(lambda: ctl.shards is not None and ctl.grpc_port != 0, what="the controller serving")
        assert ctl.shards is not None
        yield ctl, ctl.shards, stop, serving
    finally:
        stop.set()
        if not serving.done():
            serving.cancel()


def _root_causes(ctl: Controller) -> set[str]:
    return {i.root_cause for i in ctl.detection.incidents.list_incidents(active_only=True)}


class TestShardedDetection:
    async def test_faults_direct_and_relayed_become_incidents_and_reports_are_acked(self, tmp_path: Path) -> None:
        """Report-driven, event-driven and event-then-report faults, on nodes spread over two shards."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        assert ctl.shards is not None and len(ctl.shards.pids) == 2
        # one node on each shard behind the relay, and one on each shard direct
        names = [f"node-{i:03d}" for i in range(20)]
        on = [[n for n in names if ctl.shards.shard_of(n) == k] for k in (0, 1)]
        via_relay, via_port = [f"127.0.0.1:{rport}"], [f"127.0.0.1:{cport}"]
        relayed = [make_sim_agent(n, tmp_path, via_relay, seed=i) for i, n in enumerate((on[0][0], on[1][0]))]
        direct = [make_sim_agent(n, tmp_path, via_port, seed=2 + i) for i, n in enumerate((on[0][1], on[1][1]))]
        agents = relayed + direct
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay's upstream")
            for a in agents:
                a.start()
            reg = ctl.registry
            await wait_for(
                lambda: all(
                    reg.nodes.get(a.sim.node_id) is not None and reg.nodes[a.sim.node_id].acked_report_seq >= 3
                    for a in agents
                ),
                what="reports decided for every node",
            )

            relayed[1].sim.inject("gpu_row_remap_failure", "gpu-1")  # seen only in reports
            direct[0].sim.inject("gpu_xid", "gpu-2", xid=79)  # an event
            direct[1].sim.inject("nic_down", "nic-3")  # an event, then the port's state in reports
            expected = {
                f"{relayed[1].sim.node_id}/gpu-1",
                f"{direct[0].sim.node_id}/gpu-2",
                f"{direct[1].sim.node_id}/nic-3",
            }
            await wait_for(
                lambda: expected <= _root_causes(ctl),
                timeout=30,
                what="an incident for each fault",
            )
            assert ctl.metrics.registry.get_sample_value("starpulse_detect_shards") == 2
            # The conditions came from the shards' engines, not the controller's own.
            assert not [c for c in ctl.detection.engine.active() if c.node in {a.sim.node_id for a in agents}]
            # Acks flow back, direct and relayed, so agents forget what was delivered.
            for a in agents:
                await wait_for(lambda a=a: a.agent.link.buffer.depth() == 0, what=f"{a.sim.node_id}'s events acked")
            first = reg.nodes[relayed[0].sim.node_id]
            assert first.state == "online"
            assert first.latest_report is None  # the report stays in its shard
            # Each shard says where its CPU went (bench.scale's split), and so does the loop.
            await wait_for(lambda: len(ctl.metrics.shard_stage_cpu) == 2, what="both shards' CPU by stage")
            for stages in ctl.metrics.shard_stage_cpu.values():
                assert stages["rules"] > 0 and stages["decode_validate"] > 0
            loop = ctl.metrics.stage_cpu.seconds
            assert loop["verdicts"] > 0 and loop["shard_handover"] > 0 and loop["relay_dispatch"] > 0
        finally:
            await halt_agents(agents)
            await relay.stop()
            await ctl.stop()


async def _stage_samples(http_port: int) -> dict[tuple[str, str], float]:
    """``starpulse_event_stage_seconds`` as scraped from the controller's /metrics: (sample, stage) -> value."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{http_port}/metrics") as r:
        text = await r.text()
    return {
        (sample.name, sample.labels["stage"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "starpulse_event_stage_seconds"
        for sample in family.samples
        if sample.name.endswith(("_count", "_sum"))
    }


@pytest.mark.parametrize("workers", [0, 2], ids=["unsharded", "two-shards"])
class TestOneBehaviourShardedOrNot:
    """A fault's trace and its grouping window do not depend on where detection runs."""

    async def test_a_port_down_event_is_traced_to_the_webhook_and_grouped_in_the_event_window(
        self, tmp_path: Path, workers: int
    ) -> None:
        """nic-3 of node-001 goes down (the agent's link watch sends it as an event; reports come
        only every 5 s): every stage from buffered to delivered is on /metrics once, adding up to
        the trace, and the port's condition waited the event window, not the reports' cadence."""
        # a 60 s sweep: no detection tick helps, grouping is the window's own task
        ctl, receiver, fabric, port = two_nodes_and_a_webhook(tmp_path, 60.0, DetectionConfig(workers=workers))
        windows = ctl.detection.windows
        chosen: dict[tuple[str, str], float] = {}
        ask = windows.window_s

        def window_s(cond: Condition) -> float:
            chosen[cond.key] = seconds = ask(cond)
            return seconds

        windows.window_s = window_s  # type: ignore[method-assign]
        agents = [
            make_sim_agent(n, tmp_path, [f"127.0.0.1:{port}"], interval_s=5.0, seed=i)
            for i, n in enumerate(fabric.nodes())
        ]
        async with receiving(receiver):
            await ctl.start()
            try:
                assert (ctl.shards is not None) == (workers > 0)
                for a in agents:
                    a.start()
                await wait_for(lambda: len(ctl.registry.nodes) == 2, what="registration")
                agents[1].sim.inject("nic_down", "nic-3")
                await wait_for(lambda: len(ctl.stages.done) >= 1, 30, "the finished trace")
                (trace,) = ctl.stages.done
                assert (trace.node, trace.kind) == ("node-001", "nic_link_down")
                assert list(trace.marks) == list(STAGES)  # every stage stamped, agent, shard and controller
                incidents = ctl.detection.incidents.list_incidents(active_only=True)
                assert [(i.kind, i.root_cause) for i in incidents] == [("nic_fault", "node-001/nic-3")]
                (key,) = incidents[0].condition_keys
                assert chosen[key] == windows.settings.event_window_s  # not the reports' interval + slack
                samples = await _stage_samples(ctl.http_port)
                assert [samples[("starpulse_event_stage_seconds_count", s)] for s in STAGES[1:]] == [1.0] * 7
                summed = sum(samples[("starpulse_event_stage_seconds_sum", s)] for s in STAGES[1:])
                assert summed == pytest.approx(trace.total_s(), abs=1e-6)
                if workers:  # the conditions were the shards' own, not the controller's engine's
                    assert not [c for c in ctl.detection.engine.active() if c.node == "node-001"]
            finally:
                await halt_agents(agents)
                await ctl.stop()


@pytest.mark.parametrize("workers", [0, 1], ids=["decided-as-read", "one-shard"])
class TestRelayedBadReports:
    """Relayed reports skip their stream's task (decided as the relay's batch is read, or handed to
    a shard), so a bad one must still end its own stream, with or without shards."""

    async def test_an_invalid_relayed_report_ends_its_own_stream(self, tmp_path: Path, workers: int) -> None:
        """After the Welcome: a delta report first asks for a full one; an invalid report then ends
        that stream INVALID_ARGUMENT and nothing of it is taken; a good agent goes on."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport, workers=workers)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        agent = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{rport}"])
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay's upstream")
            agent.start()
            await wait_for(lambda: "node-000" in ctl.registry.nodes, what="the good node")
            hello = spb.AgentMessage(hello=spb.Hello(node_id="node-050", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
            delta = tpb.Report(seq=1, counters_delta=True, gpus=[tpb.GpuSample(index=0, temperature_c=40.0)])
            bad = tpb.Report(seq=2, gpus=[tpb.GpuSample(index=0, temperature_c=math.nan)])
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{rport}")
            try:
                call = channel.stream_stream(
                    "/starpulse.v1.Telemetry/Connect", response_deserializer=spb.ControllerMessage.FromString
                )()
                await call.write(hello.SerializeToString())
                assert (await asyncio.wait_for(call.read(), 10)).HasField("welcome")
                # Sent after the Welcome, so the reports do not queue behind the Hello.
                await call.write(spb.AgentMessage(report=delta).SerializeToString())
                ack = (await asyncio.wait_for(call.read(), 10)).ack
                assert ack.full_report_needed and ack.report_seq == 1
                await call.write(spb.AgentMessage(report=bad).SerializeToString())
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "temperature_c" in (err.value.details() or "")
            finally:
                await channel.close()
            assert ctl.metrics.rejected.labels("invalid_message")._value.get() == 1
            assert ctl.registry.nodes["node-050"].acked_report_seq == 1  # nothing of the invalid one was taken

            before = ctl.registry.nodes["node-000"].acked_report_seq
            await wait_for(
                lambda: ctl.registry.nodes["node-000"].acked_report_seq > before, what="the good agent still reporting"
            )
        finally:
            await agent.halt()
            await relay.stop()
            await ctl.stop()

    async def test_undecodable_report_bytes_end_the_stream(self, tmp_path: Path, workers: int) -> None:
        """Bytes that look like a report (field 2) but are not one: refused where they are decoded."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport, workers=workers)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay's upstream")
            hello = spb.AgentMessage(hello=spb.Hello(node_id="node-051", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{rport}")
            try:
                call = channel.stream_stream("/starpulse.v1.Telemetry/Connect")()
                await call.write(hello.SerializeToString())
                await asyncio.wait_for(call.read(), 10)  # the Welcome: the bytes below skip the stream's queue
                await call.write(b"\x12\x03\xff\xff\xff")  # AgentMessage.report, 3 bytes that are no Report
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "not an AgentMessage" in (err.value.details() or "")
            finally:
                await channel.close()
        finally:
            await relay.stop()
            await ctl.stop()


class TestShardLoss:
    async def test_a_stop_signal_for_the_service_leaves_shards_to_the_controller(self, tmp_path: Path) -> None:
        """systemd signals the whole cgroup: shards ignore it and end when the controller closes their stdin."""
        async with _serving_with_one_shard(tmp_path) as (ctl, shards, stop, serving):
            os.kill(shards.pids[0], signal.SIGTERM)
            os.kill(shards.pids[0], signal.SIGINT)
            await asyncio.sleep(1.0)
            assert shards.running() == [0] and not ctl.failed.is_set()
            stop.set()
            await asyncio.wait_for(serving, 30)  # a clean stop: no ShardLost
            assert shards.running() == []

    async def test_a_shard_that_dies_stops_the_controller(self, tmp_path: Path) -> None:
        """Without the shard some nodes would go unwatched: the controller stops and says why."""
        async with _serving_with_one_shard(tmp_path) as (ctl, shards, _, serving):
            os.kill(shards.pids[0], signal.SIGKILL)
            with pytest.raises(ShardLost, match="detection shard 0"):
                await asyncio.wait_for(serving, 30)
            assert ctl.health is not None
