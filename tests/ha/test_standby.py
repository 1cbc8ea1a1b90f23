"""What a standby serves over real gRPC: reads from its replicated SQLite, refusals naming the leader."""

from __future__ import annotations

import collections
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.ha import standby as standby_module
from controller.ha.standby import LEADER_METADATA_KEY, StandbyQuery, StandbyTelemetry, standby_admin
from controller.service import Controller, ControllerConfig
from controller.store import Store, StoredNode
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.helpers import make_sim_agent, wait_for


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(listen="127.0.0.1:0", http="127.0.0.1:0", db_path=tmp_path / "leader.db"), clock=SYSTEM_CLOCK
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


@pytest.fixture
async def standby(tmp_path: Path, leader: Controller) -> AsyncIterator[tuple[str, Store]]:
    store = Store(tmp_path / "standby.db")
    row = StoredNode("node-007", ipb.NODE_ROLE_COMPUTE, "online", 1, 2, "1.0", "h7", ipb.Inventory(), "e", 0)
    store.upsert_node(row)
    hint = f"127.0.0.1:{leader.grpc_port}"
    server = grpc.aio.server()
    sgrpc.add_TelemetryServicer_to_server(StandbyTelemetry(lambda: hint), server)
    sgrpc.add_QueryServicer_to_server(StandbyQuery(store, lambda: hint, FakeClock()), server)
    sgrpc.add_AdminServicer_to_server(standby_admin(lambda: hint), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", store
    await server.stop(0)
    store.close()


class TestStandby:
    async def test_reads_come_from_the_replicated_tables(self, standby: tuple[str, Store]) -> None:
        """ListNodes on a standby answers from its SQLite copy."""
        async with grpc.aio.insecure_channel(standby[0]) as ch:
            resp = await sgrpc.QueryStub(ch).ListNodes(spb.ListNodesRequest())
        assert [(n.node_id, n.hostname) for n in resp.nodes] == [("node-007", "h7")]

    async def test_incidents_and_their_timeline_come_from_the_replicated_tables(
        self, standby: tuple[str, Store]
    ) -> None:
        """ListIncidents and GetIncident answer from the standby's SQLite copy (no correlator there)."""
        rows = IncidentStore(standby[1].connection)
        incident = Incident("", "gpu_fault", "node-007/gpu-1", "gpu", ["node-007"], [], "fatal", "reset_gpu", [], 1000)
        iid = rows.open(incident, {"reason": "xid 79"}).id
        async with grpc.aio.insecure_channel(standby[0]) as ch:
            listed = await sgrpc.QueryStub(ch).ListIncidents(spb.ListIncidentsRequest())
            detail = await sgrpc.QueryStub(ch).GetIncident(spb.IncidentRequest(id=iid))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sgrpc.QueryStub(ch).GetIncident(spb.IncidentRequest(id="inc-999999"))
        assert [i.id for i in listed.incidents] == [iid]
        assert detail.incident.root_cause == "node-007/gpu-1"
        assert [(e["what"], e["detail"]) for e in json.loads(detail.timeline_json)] == [("opened", "xid 79")]
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

    async def test_topology_is_refused_with_the_leaders_address(
        self, standby: tuple[str, Store], leader: Controller
    ) -> None:
        """Only the leader reconciles LLDP: a standby names it instead of answering."""
        async with grpc.aio.insecure_channel(standby[0]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sgrpc.QueryStub(ch).GetTopology(spb.TopologyRequest())
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (LEADER_METADATA_KEY, f"127.0.0.1:{leader.grpc_port}") in tuple(info.value.trailing_metadata() or ())

    async def test_admin_calls_are_refused_with_the_leaders_address(
        self, standby: tuple[str, Store], leader: Controller
    ) -> None:
        """An operator write on a standby: FAILED_PRECONDITION, the leader in details and trailing metadata."""
        async with grpc.aio.insecure_channel(standby[0]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sgrpc.AdminStub(ch).Cordon(spb.NodeActionRequest(node="node-007", actor="alice"))
        err = info.value
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"127.0.0.1:{leader.grpc_port}" in (err.details() or "")
        assert (LEADER_METADATA_KEY, f"127.0.0.1:{leader.grpc_port}") in tuple(err.trailing_metadata() or ())

    async def test_agent_follows_the_hint_to_the_leader(
        self, tmp_path: Path, standby: tuple[str, Store], leader: Controller
    ) -> None:
        """An agent configured with only the standby ends up streaming to the leader it names."""
        agent = make_sim_agent("node-001", tmp_path, [standby[0]])
        agent.start()
        try:
            await wait_for(agent.agent.link.connected.is_set, 20, "the agent to reach the leader")
            await wait_for(lambda: "node-001" in leader.registry.nodes, 10, "the leader to know the node")
            assert agent.agent.link.targets == [standby[0], f"127.0.0.1:{leader.grpc_port}"]
        finally:
            await agent.halt()


class TestStandbyRefusesStreams:
    """Agents' streams are refused after their Hello, so the refusal is what the agent sees."""

    async def test_every_refusal_reaches_a_client_that_writes_then_reads(
        self, standby: tuple[str, Store], leader: Controller
    ) -> None:
        """The agent's order (Hello, then read): FAILED_PRECONDITION and the hint, never gRPC's own INTERNAL.

        Refused before the Hello was read, a refusal that overtook the Hello write surfaced as
        INTERNAL "Internal error from Core" and lost the hint (seen under load).
        """
        seen = collections.Counter()
        for _ in range(300):  # refused at once, about 1 in 200 came back INTERNAL (loopback, loaded or not)
            async with grpc.aio.insecure_channel(standby[0]) as ch:  # a channel per attempt, as the link does
                call = sgrpc.TelemetryStub(ch).Connect()
                with pytest.raises(grpc.aio.AioRpcError) as info:  # from the write or the read
                    await call.write(spb.AgentMessage(hello=spb.Hello(node_id="node-001")))
                    await call.read()
            err = info.value
            seen[(err.code(), dict(err.trailing_metadata() or ()).get(LEADER_METADATA_KEY))] += 1
        assert list(seen) == [(grpc.StatusCode.FAILED_PRECONDITION, f"127.0.0.1:{leader.grpc_port}")], seen

    async def test_a_client_that_sends_nothing_is_refused_all_the_same(
        self, standby: tuple[str, Store], leader: Controller, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(standby_module, "FIRST_MESSAGE_WAIT_S", 0.2)
        async with grpc.aio.insecure_channel(standby[0]) as ch:
            call = sgrpc.TelemetryStub(ch).Connect()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (LEADER_METADATA_KEY, f"127.0.0.1:{leader.grpc_port}") in tuple(info.value.trailing_metadata() or ())
