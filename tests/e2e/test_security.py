"""Security refusals over real gRPC on loopback, with certificates from ``make_test_ca``.

mTLS: no certificate, a certificate from another CA, a node speaking for another node,
an oversize message. Admin credential: missing, wrong, right; closed reads. Hostile
names never reach the scheduler.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.auth import AuthConfig, bearer_metadata
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.tls import TestCA, TLSSettings, load_channel_credentials, make_test_ca
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import make_sim_agent, stream_session, wait_for

TOKEN = secrets.token_urlsafe(24)
NODES = ["node-000", "node-001", "node-002"]
OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 8 * 1024 * 1024)]


@dataclass
class Rig:
    controller: Controller
    sim: SimScheduler
    ca: TestCA
    target: str

    def channel(self, who: TLSSettings | None) -> grpc.aio.Channel:
        if who is None:  # TLS that trusts the server but presents no client certificate
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca.ca_cert.read_bytes())
        else:
            creds = load_channel_credentials(who)
        return grpc.aio.secure_channel(self.target, creds, options=OPTIONS)


async def _rig(tmp_path: Path, auth: AuthConfig) -> Rig:
    ca = make_test_ca(tmp_path / "pki", NODES)
    fabric = generate_fabric(3, 2, 2, 4, 2)  # node-000..node-002
    sim = SimScheduler(fabric.nodes())
    ctl = Controller(
        ControllerConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            fabric=fabric,
            max_message_bytes=64 * 1024,
            heal=HealSettings(scheduler=sim, guards=GuardConfig(mode="enforce")),
            tls=ca.controller,
            auth=auth,
            grace_s=0.5,
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    return Rig(ctl, sim, ca, f"127.0.0.1:{ctl.grpc_port}")


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await _rig(tmp_path, AuthConfig(admin_tokens=[TOKEN]))
    try:
        yield r
    finally:
        await r.controller.stop()


def _hello(node_id: str) -> spb.AgentMessage:
    return spb.AgentMessage(
        hello=spb.Hello(node_id=node_id, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e1", next_event_seq=1)
    )


async def _session(channel: grpc.aio.Channel, *messages: spb.AgentMessage) -> grpc.StatusCode:
    """Send messages on one Telemetry stream; return the status it ended with."""
    return await stream_session(channel, *messages)


def _cordon(node: str = "node-000") -> spb.NodeActionRequest:
    return spb.NodeActionRequest(node=node, reason="bad fan", actor="alice")


class TestMutualTLS:
    async def test_agent_with_valid_certificate_streams_and_registers(self, rig: Rig, tmp_path: Path) -> None:
        """A real agent with node-000's certificate connects, registers and reports."""
        agent = make_sim_agent("node-000", tmp_path / "agents", [rig.target])
        # make_sim_agent builds a plaintext link; give it node-000's TLS credentials.
        agent.agent.link._credentials = load_channel_credentials(rig.ca.nodes["node-000"])
        agent.start()
        try:
            await wait_for(
                lambda: (
                    (n := rig.controller.registry.nodes.get("node-000")) is not None and n.latest_report is not None
                ),
                what="node-000 registered with a report over mTLS",
            )
            assert rig.controller.registry.nodes["node-000"].state == "online"
        finally:
            await agent.halt()

    async def test_agent_config_tls_builds_a_secure_link(self, rig: Rig, tmp_path: Path) -> None:
        """AgentConfig.tls is what the agent uses: with it the link carries channel credentials."""
        from agent.factory import build_agent
        from agent.runtime import AgentConfig
        from agent.sim.node import SimNode

        agent = build_agent(
            AgentConfig(
                node_id="node-001",
                controllers=[rig.target],
                interval_s=0.3,
                buffer_path=str(tmp_path / "b.db"),
                tls=rig.ca.nodes["node-001"],
            ),
            "sim",
            sim=SimNode("node-001", tmp_path / "hw", seed=1),
        )
        assert agent.link._credentials is not None
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await wait_for(lambda: "node-001" in rig.controller.registry.nodes, what="node-001 registered")
        finally:
            stop.set()
            await task

    async def test_client_without_certificate_is_unavailable(self, rig: Rig) -> None:
        """The handshake fails: the controller requires a client certificate (UNAVAILABLE, not a status)."""
        code = await _session(rig.channel(None), _hello("node-000"))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "node-000" not in rig.controller.registry.nodes

    async def test_plaintext_client_is_refused(self, rig: Rig) -> None:
        code = await _session(grpc.aio.insecure_channel(rig.target, options=OPTIONS), _hello("node-000"))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "node-000" not in rig.controller.registry.nodes

    async def test_certificate_from_another_ca_is_refused(self, rig: Rig, tmp_path: Path) -> None:
        """node-000's name on a certificate our CA did not sign gets nowhere."""
        other = make_test_ca(tmp_path / "other-pki", ["node-000"])
        forged = TLSSettings(
            ca_file=rig.ca.ca_cert,  # trusts the real controller...
            cert_file=other.nodes["node-000"].cert_file,  # ...but presents a stranger's certificate
            key_file=other.nodes["node-000"].key_file,
        )
        code = await _session(rig.channel(forged), _hello("node-000"))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "node-000" not in rig.controller.registry.nodes

    async def test_node_cannot_speak_for_another(self, rig: Rig) -> None:
        """node-001's certificate with a Hello for node-002: PERMISSION_DENIED, nothing stored for node-002."""
        code = await _session(
            rig.channel(rig.ca.nodes["node-001"]),
            _hello("node-002"),
            spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=1)),
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "node-002" not in rig.controller.registry.nodes
        assert rig.controller.metrics.rejected.labels("identity_mismatch")._value.get() == 1
        # and its own name still works
        code = await _session(
            rig.channel(rig.ca.nodes["node-001"]),
            _hello("node-001"),
            spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=1)),
        )
        assert code == grpc.StatusCode.OK
        assert rig.controller.registry.nodes["node-001"].latest_report is not None

    async def test_admin_certificate_is_not_a_node(self, rig: Rig) -> None:
        code = await _session(rig.channel(rig.ca.admin), _hello("node-000"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "node-000" not in rig.controller.registry.nodes

    async def test_admin_certificate_cannot_stream_as_itself(self, rig: Rig) -> None:
        """Issue 32: the CLI's admin certificate saying Hello as the name it carries ("admin") is
        refused for its role, before the fabric is asked whether such a node exists."""
        code = await _session(rig.channel(rig.ca.admin), _hello("admin"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert rig.controller.metrics.rejected.labels("role_mismatch")._value.get() == 1
        assert "admin" not in rig.controller.registry.nodes

    async def test_node_id_with_a_trailing_newline_is_refused(self, rig: Rig) -> None:
        """Issue 32: names are checked whole (``$`` alone would let "node-000\n" through)."""
        code = await _session(rig.channel(rig.ca.nodes["node-000"]), _hello("node-000\n"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "node-000\n" not in rig.controller.registry.nodes

    async def test_oversize_message_is_resource_exhausted(self, rig: Rig) -> None:
        big = tpb.Report(seq=1)
        big.nics.add(rdma_device="mlx5_0").counters.update({f"c{i}": i for i in range(20_000)})
        code = await _session(rig.channel(rig.ca.nodes["node-000"]), _hello("node-000"), spb.AgentMessage(report=big))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert rig.controller.registry.nodes["node-000"].latest_report is None


class TestAdminCredential:
    async def _call(self, rig: Rig, method: str, request: object, token: str | None) -> grpc.StatusCode:
        async with rig.channel(rig.ca.admin) as ch:
            stub = sgrpc.AdminStub(ch)
            try:
                await getattr(stub, method)(request, metadata=bearer_metadata(token) if token else None, timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
            return grpc.StatusCode.OK

    async def test_cordon_without_token_is_unauthenticated(self, rig: Rig) -> None:
        assert await self._call(rig, "Cordon", _cordon(), None) == grpc.StatusCode.UNAUTHENTICATED
        assert rig.sim.actions == []

    async def test_cordon_with_wrong_token_is_permission_denied(self, rig: Rig) -> None:
        assert await self._call(rig, "Cordon", _cordon(), TOKEN + "x") == grpc.StatusCode.PERMISSION_DENIED
        assert rig.sim.actions == []

    async def test_malformed_header_is_unauthenticated(self, rig: Rig) -> None:
        async with rig.channel(rig.ca.admin) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await sgrpc.AdminStub(ch).Cordon(_cordon(), metadata=(("authorization", TOKEN),), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    async def test_cordon_with_right_token_acts(self, rig: Rig) -> None:
        assert await self._call(rig, "Cordon", _cordon(), TOKEN) == grpc.StatusCode.OK
        assert [a[:2] for a in rig.sim.actions] == [("drain", "node-000")]  # the sim cordons by draining

    async def test_every_admin_method_needs_the_token(self, rig: Rig) -> None:
        requests: dict[str, object] = {
            "Uncordon": _cordon(),
            "Drain": _cordon(),
            "Approve": spb.ApproveRequest(incident_id="inc-1", actor="alice"),
            "GetBreaker": spb.BreakerRequest(),
            "ResetBreaker": spb.BreakerResetRequest(actor="alice"),
            "ListSpares": spb.SparesRequest(),
            "ListJobs": spb.JobsRequest(),
        }
        for method, request in requests.items():
            assert await self._call(rig, method, request, None) == grpc.StatusCode.UNAUTHENTICATED, method
        assert await self._call(rig, "ResetBreaker", spb.BreakerResetRequest(actor="alice"), TOKEN) == (
            grpc.StatusCode.OK
        )
        assert rig.sim.actions == []

    async def test_reads_open_by_default(self, rig: Rig) -> None:
        async with rig.channel(rig.ca.admin) as ch:
            resp = await sgrpc.QueryStub(ch).ListNodes(spb.ListNodesRequest(), timeout=10)
        assert resp is not None

    async def test_hostile_names_are_invalid_argument_before_the_scheduler(self, rig: Rig) -> None:
        for name in ("node-000; rm -rf /", "../../etc", "node-000\nnode-001", "$(reboot)", "-rf", "", "a" * 64):
            for method in ("Cordon", "Drain", "Uncordon"):
                code = await self._call(rig, method, _cordon(name), TOKEN)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, name)
            code = await self._call(
                rig, "Approve", spb.ApproveRequest(incident_id="inc-1", node=name or "x;y", actor="alice"), TOKEN
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        assert rig.sim.actions == []


async def test_closed_reads_need_a_token(tmp_path: Path) -> None:
    rig = await _rig(tmp_path, AuthConfig(admin_tokens=[TOKEN], open_reads=False))
    try:
        async with rig.channel(rig.ca.admin) as ch:
            query = sgrpc.QueryStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await query.ListNodes(spb.ListNodesRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await query.ListEvents(spb.ListEventsRequest(), metadata=bearer_metadata("w" * 20), timeout=10)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            await query.ListNodes(spb.ListNodesRequest(), metadata=bearer_metadata(TOKEN), timeout=10)
    finally:
        await rig.controller.stop()


async def test_admin_certificate_name_counts_as_credential(tmp_path: Path) -> None:
    """With admin_cert_names=["admin"], the admin client certificate is the credential; a node's is not."""
    rig = await _rig(tmp_path, AuthConfig(admin_tokens=[TOKEN], admin_cert_names=["admin"]))
    try:
        async with rig.channel(rig.ca.admin) as ch:
            await sgrpc.AdminStub(ch).Cordon(_cordon(), timeout=10)
        async with rig.channel(rig.ca.nodes["node-001"]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await sgrpc.AdminStub(ch).Cordon(_cordon("node-001"), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert [a[1] for a in rig.sim.actions] == ["node-000"]
    finally:
        await rig.controller.stop()


async def test_cli_sends_certificate_and_token(rig: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`starpulse cordon` with --tls-* and --admin-token-file acts; without the token it is one line, exit 2."""
    from starpulse.app import cli

    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    admin = rig.ca.admin
    base = [
        "cordon",
        "node-001",
        "--reason",
        "bad fan",
        "--actor",
        "alice",
        "--controller",
        rig.target,
        "--tls-ca",
        str(admin.ca_file),
        "--tls-cert",
        str(admin.cert_file),
        "--tls-key",
        str(admin.key_file),
    ]

    def run(argv: list[str]) -> int:  # the command itself (main() sets signals: main thread only)
        args = cli.build_parser().parse_args(argv)
        return int(args.func(args))

    rc = await asyncio.to_thread(run, base)
    assert rc == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    rc = await asyncio.to_thread(run, [*base, "--admin-token-file", str(token_file)])
    assert rc == 0, capsys.readouterr().err
    assert [a[:2] for a in rig.sim.actions] == [("drain", "node-001")]
