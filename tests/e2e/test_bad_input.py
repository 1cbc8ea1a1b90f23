"""Bad input gets a clear gRPC status and a log line and never takes the controller down; bad settings: a line each."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controller.service import Controller, ControllerConfig
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, stream_session


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            allowed_nodes=["node-000", "node-001"],
            max_message_bytes=64 * 1024,
            rate_per_node_per_s=5,
            rate_burst=20,
        )
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


def _hello(node_id: str = "node-000") -> spb.AgentMessage:
    return spb.AgentMessage(
        hello=spb.Hello(node_id=node_id, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e1", next_event_seq=1)
    )


async def _session(ctl: Controller, *messages: spb.AgentMessage) -> grpc.StatusCode:
    """Send messages on one stream while reading; return the status the controller ended it with."""
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{ctl.grpc_port}", options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
    )
    return await stream_session(channel, *messages)


async def _still_serving(ctl: Controller) -> None:
    code = await _session(ctl, _hello("node-001"), spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=1)))
    assert code == grpc.StatusCode.OK
    assert ctl.registry.nodes["node-001"].latest_report is not None


class TestRejections:
    async def test_first_message_must_be_hello(self, controller: Controller) -> None:
        """A report before Hello ends the stream with FAILED_PRECONDITION."""
        code = await _session(controller, spb.AgentMessage(report=tpb.Report(seq=1)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert controller.metrics.rejected.labels("no_hello")._value.get() == 1
        await _still_serving(controller)

    async def test_hostile_node_id_is_invalid_argument(self, controller: Controller) -> None:
        """A node id with shell or path characters is refused before it reaches any store."""
        code = await _session(controller, _hello("node-000; rm -rf /"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "node-000; rm -rf /" not in controller.registry.nodes

    async def test_unknown_node_is_not_found(self, controller: Controller) -> None:
        """A node outside the configured fabric is refused with NOT_FOUND."""
        assert await _session(controller, _hello("node-999")) == grpc.StatusCode.NOT_FOUND
        assert "node-999" not in controller.registry.nodes

    async def test_oversize_message_is_resource_exhausted(self, controller: Controller) -> None:
        """A message over the controller's size limit gets RESOURCE_EXHAUSTED, and the controller lives on."""
        big = tpb.Report(seq=1)
        nic = big.nics.add(rdma_device="mlx5_0")
        nic.counters.update({f"c{i}": i for i in range(20_000)})
        code = await _session(controller, _hello(), spb.AgentMessage(report=big))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await _still_serving(controller)

    async def test_malformed_bytes_are_rejected(self, controller: Controller) -> None:
        """Bytes that are not a protobuf AgentMessage end the stream with an error status."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}") as ch:
            raw = ch.stream_stream("/starpulse.v1.Telemetry/Connect")
            call = raw()
            await call.write(b"\xff\xff\xff\xff not a protobuf")
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        await _still_serving(controller)

    async def test_unknown_event_kind_is_invalid_argument(self, controller: Controller) -> None:
        """An event whose kind is not in the contract is refused; nothing is stored."""
        bad = tpb.Event(seq=1, kind=999, severity=tpb.SEVERITY_WARNING, component="gpu-0")  # type: ignore[arg-type]
        code = await _session(controller, _hello(), spb.AgentMessage(event=bad))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert controller.store.count_events() == 0

    async def test_non_finite_numbers_are_invalid_argument(self, controller: Controller) -> None:
        """A NaN temperature is refused rather than poisoning detection."""
        report = tpb.Report(seq=1)
        report.gpus.add(index=0, temperature_c=float("nan"))
        code = await _session(controller, _hello(), spb.AgentMessage(report=report))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

    async def test_second_hello_is_invalid_argument(self, controller: Controller) -> None:
        """Hello is only the first message; another one mid-stream is a protocol error."""
        assert await _session(controller, _hello(), _hello()) == grpc.StatusCode.INVALID_ARGUMENT

    async def test_flooding_node_is_rate_limited(self, controller: Controller) -> None:
        """A node sending faster than its budget gets RESOURCE_EXHAUSTED; others are unaffected."""
        flood = [spb.AgentMessage(report=tpb.Report(seq=i + 1, timestamp_ms=1)) for i in range(200)]
        code = await _session(controller, _hello(), *flood)
        # The server ends the call with RESOURCE_EXHAUSTED; a client with writes still in flight
        # may see its own core's INTERNAL instead (a gRPC race, not ours): both end the stream.
        assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL)
        assert controller.metrics.rejected.labels("rate_limited")._value.get() == 1
        assert controller.registry.nodes["node-000"].acked_report_seq <= 21  # burst 20, then refused
        await _still_serving(controller)


def _starpulse(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("STARPULSE_")}, **(env or {})},
    )


class TestBadSettings:
    """Bad settings from a file, the environment or flags: one line per problem, exit 2, never a traceback."""

    def test_controller_names_the_file_the_variable_and_the_flag(self, tmp_path: Path) -> None:
        path = tmp_path / "controller.yaml"
        path.write_text("ingest:\n  heartbeat_timeout_s: soon\ndetection:\n  correlation:\n    settle_s: x\n")
        out = _starpulse(
            "controller", "--config", str(path), "--listen", "nowhere", env={"STARPULSE_HEAL__GUARDS__MODE": "yolo"}
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.splitlines() == [
            "starpulse controller: --listen: server.listen: must be HOST:PORT, got 'nowhere'",
            f"starpulse controller: {path}: ingest.heartbeat_timeout_s: must be a number > 0, got 'soon'",
            f"starpulse controller: {path}: detection.correlation.settle_s: must be a number >= 0, got 'x'",
            "starpulse controller: STARPULSE_HEAL__GUARDS__MODE: heal.guards.mode: "
            "must be one of enforce, dry_run, manual, got 'yolo'",
        ]

    def test_agent_flags_alone_get_the_same_checks(self) -> None:
        out = _starpulse("agent", "--controller", "c:1", "--allow-command", "format=/sbin/mkfs", "--sim-nics", "99")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.splitlines() == [
            "starpulse agent: --allow-command 'format=/sbin/mkfs': expected KIND=ARGV0,ARG,... with KIND one of "
            "gpu_reset, reboot, run_diagnostic, diagnostic.NAME",
            "starpulse agent: --node-id is required (or agent.node_id in --config FILE)",
            "starpulse agent: --sim-nics: hardware.sim_nics: must be an integer >= 0 and <= 28, got 99",
        ]

    def test_relay_file_and_config_check(self, tmp_path: Path) -> None:
        path = tmp_path / "relay.yaml"
        path.write_text("relay:\n  relay_id: r1\n  controlers: [c:1]\n")
        out = _starpulse("relay", "--config", str(path))
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.splitlines() == [
            f"starpulse relay: {path}: relay.controlers: unknown key, did you mean 'controllers'?",
            f"starpulse relay: {path}: relay.controllers: is required",
        ]
        out = _starpulse("config", "check", str(path))
        assert out.returncode == 2 and len(out.stdout.splitlines()) == 2 and out.stderr == ""
