"""Agents through a relay (`starpulse relay`) to a real controller, all over loopback gRPC.

The relay forwards agents' messages as bytes in batches; the controller must treat a
relayed stream exactly like a direct one: registration, detection, acks, rejection of bad
input per stream, and no event lost or stored twice when the relay or the controller
restarts in the middle.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc

from controller.service import Controller, ControllerConfig
from relay.service import Relay, RelayConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.findings import event_kind_name
from starpulse.core.tls import TestCA, load_channel_credentials, make_test_ca
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.helpers import free_port, halt_agents, make_relay, make_sim_agent, stream_session, wait_for


def _controller(tmp_path: Path, port: int, **kw: object) -> Controller:
    kw.setdefault("listen", f"127.0.0.1:{port}")
    return Controller(
        ControllerConfig(
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
            **kw,  # type: ignore[arg-type]
        ),
        clock=SYSTEM_CLOCK,
    )


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        k: float(v)
        for line in text.splitlines()
        if line and not line.startswith("#")
        for k, _, v in [line.rpartition(" ")]
    }


def _stored_seqs(ctl: Controller, node: str) -> list[int]:
    return sorted(r.event.seq for r in ctl.store.list_events(node, limit=10_000))


class TestRelayedAgents:
    async def test_agents_through_a_relay_register_report_and_deliver_faults(self, tmp_path: Path) -> None:
        """Three agents behind one relay: inventory, reports, an Xid stored once and acked back to its agent."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        agents = [make_sim_agent(f"node-{i:03d}", tmp_path, [f"127.0.0.1:{rport}"], seed=i) for i in range(3)]
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay's upstream")
            for a in agents:
                a.start()
            reg = ctl.registry
            await wait_for(
                lambda: all(
                    n in reg.nodes and reg.nodes[n].latest_report is not None
                    for n in ("node-000", "node-001", "node-002")
                ),
                what="three relayed nodes reporting",
            )
            assert len(reg.nodes["node-001"].inventory.gpus) == 8
            assert ctl.metrics.relays._value.get() == 1
            assert ctl.metrics.streams._value.get() == 3  # each agent is its own stream at the controller

            agents[1].sim.inject("gpu_xid", "gpu-2", xid=79)
            await wait_for(lambda: ctl.store.count_events("node-001") >= 1, what="the relayed Xid event")
            xid = next(r.event for r in ctl.store.list_events("node-001") if event_kind_name(r.event.kind) == "xid")
            assert xid.xid == 79 and xid.component == "gpu-2"
            # The ack came back through the relay: the agent may forget the event.
            await wait_for(lambda: agents[1].agent.link.acked_event_seq >= xid.seq, what="the ack via the relay")
            await wait_for(lambda: agents[1].agent.link.buffer.depth() == 0, what="the agent's buffer emptied")
            scraped = await asyncio.to_thread(_scrape, relay.metrics_port)
            assert scraped['starpulse_relay_upstream_connected{relay="relay-a"}'] == 1
            assert scraped['starpulse_relay_agent_streams{relay="relay-a"}'] == 3
            # batched, not one batch per message
            assert (
                scraped['starpulse_relay_batches_up_total{relay="relay-a"}']
                < scraped['starpulse_relay_messages_up_total{relay="relay-a"}']
            )
        finally:
            await halt_agents(agents)
            await relay.stop()
            await ctl.stop()

    async def test_relay_restart_mid_stream_loses_and_duplicates_nothing(self, tmp_path: Path) -> None:
        """Events raised while the relay is down arrive exactly once after a new relay starts on its port."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        agents = [make_sim_agent(f"node-{i:03d}", tmp_path, [f"127.0.0.1:{rport}"], seed=i) for i in range(2)]
        try:
            for a in agents:
                a.start()
            await wait_for(lambda: len(ctl.registry.nodes) == 2, what="both nodes registered")
            for gpu in range(3):
                agents[0].sim.inject("gpu_xid", f"gpu-{gpu}", xid=31)
            await wait_for(lambda: len(_stored_seqs(ctl, "node-000")) >= 3, what="the first events")
            await relay.stop()
            for gpu in range(3, 7):
                agents[0].sim.inject("gpu_xid", f"gpu-{gpu}", xid=31)
            await asyncio.sleep(0.5)
            relay = make_relay(cport, rport)
            await relay.start()
            await wait_for(lambda: len(_stored_seqs(ctl, "node-000")) >= 7, timeout=30, what="the replayed events")
            await wait_for(lambda: agents[0].agent.link.buffer.depth() == 0, what="every event acked")
            seqs = _stored_seqs(ctl, "node-000")
            assert seqs == list(range(1, len(seqs) + 1)), seqs  # each seq once, none missing
            assert len(seqs) == 7
        finally:
            await halt_agents(agents)
            await relay.stop()
            await ctl.stop()

    async def test_controller_restart_behind_the_relay(self, tmp_path: Path) -> None:
        """The relay reconnects to a restarted controller; agents come back through it with nothing lost."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport)
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        agent = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{rport}"])
        try:
            agent.start()
            await wait_for(lambda: "node-000" in ctl.registry.nodes, what="registration")
            agent.sim.inject("gpu_xid", "gpu-0", xid=48)
            await wait_for(lambda: len(_stored_seqs(ctl, "node-000")) == 1, what="the first event")
            await ctl.stop()
            await wait_for(lambda: not relay.upstream.ready.is_set(), what="the relay noticing")
            agent.sim.inject("gpu_xid", "gpu-1", xid=48)
            ctl = _controller(tmp_path, cport)
            await ctl.start()
            await wait_for(lambda: len(_stored_seqs(ctl, "node-000")) == 2, timeout=30, what="the buffered event")
            await wait_for(lambda: agent.agent.link.buffer.depth() == 0, what="the event acked")
            assert _stored_seqs(ctl, "node-000") == [1, 2]
        finally:
            await agent.halt()
            await relay.stop()
            await ctl.stop()


class TestRelayedBadInput:
    async def test_a_bad_stream_is_refused_alone(self, tmp_path: Path) -> None:
        """Malformed bytes, a missing Hello and an unknown node end their own relayed stream; others go on."""
        cport, rport = free_port(), free_port()
        ctl = _controller(tmp_path, cport, allowed_nodes=["node-000"])
        await ctl.start()
        relay = make_relay(cport, rport)
        await relay.start()
        agent = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{rport}"])
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay's upstream")
            agent.start()
            await wait_for(lambda: "node-000" in ctl.registry.nodes, what="the good node")
            target = f"127.0.0.1:{rport}"
            raw = grpc.aio.insecure_channel(target)
            try:
                call = raw.stream_stream("/starpulse.v1.Telemetry/Connect")
                stream = call()
                await stream.write(b"\xff\xff\xff")
                await stream.done_writing()
                try:
                    while await stream.read() is not grpc.aio.EOF:
                        pass
                except grpc.aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                else:
                    raise AssertionError("malformed bytes were accepted")
            finally:
                await raw.close()
            code = await stream_session(
                grpc.aio.insecure_channel(target), spb.AgentMessage(command_result=spb.CommandResult(id="x"))
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            stranger = spb.Hello(node_id="node-999", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e")
            code = await stream_session(grpc.aio.insecure_channel(target), spb.AgentMessage(hello=stranger))
            assert code == grpc.StatusCode.NOT_FOUND
            # The good agent's stream through the same relay was not disturbed.
            before = ctl.registry.nodes["node-000"].latest_report
            await wait_for(lambda: ctl.registry.nodes["node-000"].latest_report is not before, what="more reports")
            assert agent.agent.link.connects == 1
            assert ctl.metrics.rejected.labels("malformed")._value.get() == 1
            assert ctl.metrics.rejected.labels("unknown_node")._value.get() == 1
        finally:
            await agent.halt()
            await relay.stop()
            await ctl.stop()

    async def test_controller_refuses_a_relay_without_hello(self, tmp_path: Path) -> None:
        port = free_port()
        ctl = _controller(tmp_path, port)
        await ctl.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = sgrpc.RelayStub(ch).Connect()
                await call.write(spb.RelayUp(batch=spb.RelayedAgentBatch()))
                try:
                    await call.read()
                except grpc.aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                else:
                    raise AssertionError("a relay without RelayHello was accepted")
        finally:
            await ctl.stop()

    async def test_agents_are_refused_while_the_relay_has_no_controller(self, tmp_path: Path) -> None:
        """No controller behind the relay: UNAVAILABLE at once (the agent backs off and keeps its buffer)."""
        relay = make_relay(free_port(), free_port())
        await relay.start()
        try:
            hello = spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e")
            code = await stream_session(
                grpc.aio.insecure_channel(f"127.0.0.1:{relay.port}"), spb.AgentMessage(hello=hello)
            )
            assert code == grpc.StatusCode.UNAVAILABLE
        finally:
            await relay.stop()


class TestRelayWithMutualTLS:
    """With mTLS the controller trusts a relay's word on an agent's identity only from relays it lists."""

    async def _rig(self, tmp_path: Path, relay_cert: str) -> tuple[Controller, Relay, TestCA]:
        ca = make_test_ca(tmp_path / "pki", ["node-000", "node-001"], relays=["relay-a", "relay-b"])
        ctl = _controller(tmp_path, 0, tls=ca.controller, relays=["relay-a"], listen="127.0.0.1:0")
        await ctl.start()
        relay = Relay(
            RelayConfig(
                controllers=[f"localhost:{ctl.grpc_port}"],
                relay_id=relay_cert,
                listen="127.0.0.1:0",
                linger_s=0.01,
                tls=ca.relays[relay_cert],
            )
        )
        relay.upstream.backoff.initial_s = 0.1
        relay.upstream.backoff.max_s = 0.3
        await relay.start()
        return ctl, relay, ca

    async def test_listed_relay_carries_agents_under_their_certificates_names(self, tmp_path: Path) -> None:
        ctl, relay, ca = await self._rig(tmp_path, "relay-a")
        try:
            await wait_for(relay.upstream.ready.is_set, what="relay-a accepted")
            target = f"localhost:{relay.port}"
            agent = make_sim_agent("node-000", tmp_path / "agents", [target])
            agent.agent.link._credentials = load_channel_credentials(ca.nodes["node-000"])
            agent.start()
            try:
                await wait_for(
                    lambda: (n := ctl.registry.nodes.get("node-000")) is not None and n.latest_report is not None,
                    what="node-000 through relay-a",
                )
            finally:
                await agent.halt()
            # node-001's certificate cannot speak for node-000 through the relay either.
            hello = spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e")
            creds = load_channel_credentials(ca.nodes["node-001"])
            code = await stream_session(grpc.aio.secure_channel(target, creds), spb.AgentMessage(hello=hello))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert ctl.metrics.rejected.labels("identity_mismatch")._value.get() == 1
        finally:
            await relay.stop()
            await ctl.stop()

    async def test_unlisted_relay_is_refused(self, tmp_path: Path) -> None:
        """relay-b has a valid certificate but is not in ingest.relays: refused, so it takes no agent."""
        ctl, relay, ca = await self._rig(tmp_path, "relay-b")
        try:
            await wait_for(
                lambda: ctl.metrics.rejected.labels("relay_not_allowed")._value.get() >= 1, what="relay-b refused"
            )
            assert not relay.upstream.ready.is_set()
            hello = spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e")
            creds = load_channel_credentials(ca.nodes["node-000"])
            code = await stream_session(
                grpc.aio.secure_channel(f"localhost:{relay.port}", creds), spb.AgentMessage(hello=hello)
            )
            assert code == grpc.StatusCode.UNAVAILABLE
            assert "node-000" not in ctl.registry.nodes
        finally:
            await relay.stop()
            await ctl.stop()


class TestRelayFollowsTheLeader:
    async def test_relay_given_only_a_standby_ends_up_on_the_leader(self, tmp_path: Path) -> None:
        """A standby refuses the relay naming the leader; the relay goes there and carries its agent."""
        from controller.ha.standby import StandbyRelay

        ctl = _controller(tmp_path, 0, listen="127.0.0.1:0")
        await ctl.start()
        leader = f"127.0.0.1:{ctl.grpc_port}"
        standby = grpc.aio.server()
        sgrpc.add_RelayServicer_to_server(StandbyRelay(lambda: leader), standby)
        standby_port = standby.add_insecure_port("127.0.0.1:0")
        await standby.start()
        relay = Relay(
            RelayConfig(
                controllers=[f"127.0.0.1:{standby_port}"], relay_id="relay-a", listen="127.0.0.1:0", linger_s=0.01
            )
        )
        relay.upstream.backoff.initial_s = 0.1
        await relay.start()
        agent = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{relay.port}"])
        try:
            await wait_for(relay.upstream.ready.is_set, what="the relay on the leader")
            assert relay.upstream.targets == [f"127.0.0.1:{standby_port}", leader]
            agent.start()
            await wait_for(lambda: "node-000" in ctl.registry.nodes, what="the agent through the relay")
        finally:
            await agent.halt()
            await relay.stop()
            await standby.stop(None)
            await ctl.stop()
