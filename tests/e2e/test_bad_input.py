"""Bad input gets a clear gRPC status and a log line and never takes the controller down; bad settings: a line each."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import structlog

from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
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
        ),
        clock=SYSTEM_CLOCK,
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


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a refused start (exit 2, no traceback)."""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("starpulse ")]
    return line


class TestAddressesAndFolders:
    """A port another process serves, or a state folder another agent holds, is refused with one line."""

    async def test_second_controller_on_a_served_grpc_port(self, controller: Controller, tmp_path: Path) -> None:
        """No SO_REUSEPORT sharing: the second controller exits 2 naming --listen and the address."""
        address = f"127.0.0.1:{controller.grpc_port}"
        out = _starpulse("controller", "--db", str(tmp_path / "b.db"), "--listen", address, "--http", "127.0.0.1:0")
        line = _one_line(out)
        assert (
            line
            == f"starpulse controller: --listen {address}: address already in use (another process serves this port)"
        )

    async def test_second_controller_on_a_served_http_port(self, controller: Controller, tmp_path: Path) -> None:
        """--http in use: one line, and no 'Event loop is closed' from a half-started gRPC server."""
        address = f"127.0.0.1:{controller.http_port}"
        out = _starpulse("controller", "--db", str(tmp_path / "b.db"), "--listen", "127.0.0.1:0", "--http", address)
        assert _one_line(out).startswith(f"starpulse controller: --http {address}: address already in use")
        assert "Event loop is closed" not in out.stderr + out.stdout

    def test_grpc_servers_of_ours_never_share_a_port(self) -> None:
        """Past the probe (a race), gRPC's own bind also refuses: the options turn SO_REUSEPORT off."""
        from starpulse.core.listen import GRPC_SERVER_OPTIONS, ListenError, add_grpc_port

        first = grpc.server(futures_pool(), options=GRPC_SERVER_OPTIONS)
        port = first.add_insecure_port("127.0.0.1:0")
        first.start()
        try:
            second = grpc.server(futures_pool(), options=GRPC_SERVER_OPTIONS)
            with pytest.raises(RuntimeError):
                second.add_insecure_port(f"127.0.0.1:{port}")
            with pytest.raises(ListenError, match="address already in use"):
                add_grpc_port("server.listen", second, f"127.0.0.1:{port}")
        finally:
            first.stop(0)

    def test_second_agent_on_a_state_folder_in_use(self, tmp_path: Path) -> None:
        """The lock names the folder and its holder; once released the folder is free again."""
        from agent.transport.statelock import lock_state_dir

        held = lock_state_dir(tmp_path / "state")
        out = _starpulse(
            "agent", "--controller", "127.0.0.1:1", "--node-id", "node-001", "--backend", "sim",
            "--state-dir", str(tmp_path / "state"),
        )  # fmt: skip
        assert _one_line(out) == (
            f"starpulse agent: --state-dir {tmp_path / 'state'}: already in use by agent pid {os.getpid()} "
            "(one agent per state folder)"
        )
        held.release()
        lock_state_dir(tmp_path / "state").release()  # free again: no stale lock once the holder is gone

    def test_agent_metrics_port_in_use(self, controller: Controller, tmp_path: Path) -> None:
        address = f"127.0.0.1:{controller.http_port}"
        out = _starpulse(
            "agent", "--controller", "127.0.0.1:1", "--node-id", "node-001", "--backend", "sim",
            "--state-dir", str(tmp_path / "state"), "--metrics", address,
        )  # fmt: skip
        assert _one_line(out).startswith(f"starpulse agent: --metrics {address}: address already in use")


def futures_pool() -> object:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1)


class TestCommandLine:
    """Flags a user mistypes: one line naming the flag, exit 2, nothing run."""

    @pytest.fixture(autouse=True)
    def _logging_back(self) -> Iterator[None]:
        """main() logs onto pytest's captured stderr; later tests must not write to it once closed."""
        yield
        structlog.reset_defaults()

    @pytest.mark.parametrize(
        ("argv", "line"),
        [
            (["events", "--limit", "-5"], "starpulse events: argument --limit: must be a whole number >= 1, got -5"),
            (
                ["incidents", "--limit", "x"],
                "starpulse incidents: argument --limit: must be a whole number >= 1, got 'x'",
            ),
            (
                ["topology", "generate", "--nodes", "8", "--out", "/missing/dir/f.json"],
                "starpulse topology generate: argument --out: folder '/missing/dir' does not exist",
            ),
            (["demo", "--nodes", "0"], "starpulse demo: argument --nodes: must be a whole number >= 1, got 0"),
            (["scan", "--window", "0"], "starpulse scan: argument --window: must be a number of seconds > 0, got 0"),
            (
                ["demo", "--http", "127.0.0.1:notaport"],
                "starpulse demo: argument --http: must be HOST:PORT, got '127.0.0.1:notaport'",
            ),
        ],
    )
    def test_bad_flag_values(self, argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
        from starpulse.app import cli

        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [
            f"{line} (see starpulse {' '.join(argv[:2] if argv[0] == 'topology' else argv[:1])} --help)"
        ]

    def test_client_tls_flags_go_together(self, capsys: pytest.CaptureFixture[str]) -> None:
        from starpulse.app import cli

        assert cli.main(["nodes", "--tls-ca", "ca.pem"]) == 2
        assert capsys.readouterr().err.splitlines() == [
            "starpulse nodes: --tls-ca, --tls-cert and --tls-key go together"
        ]

    def test_demo_dashboard_port_in_use(self, tmp_path: Path) -> None:
        """The demo's --http default (8080) is often taken: one line naming the flag that moves it."""
        import socket

        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            address = f"127.0.0.1:{held.getsockname()[1]}"
            out = _starpulse("demo", "--http", address, "--duration", "1", env={"TMPDIR": str(tmp_path)})
        assert not list(tmp_path.glob("starpulse-demo-*.log"))  # no log file left of a demo that never ran
        assert (
            _one_line(out)
            == f"starpulse demo: --http {address}: address already in use (another process serves this port)"
        )

    def test_unwritable_out_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The folder exists but the file cannot be written (a folder of that name): one line, exit 2."""
        from starpulse.app import cli

        (tmp_path / "f.json").mkdir()
        assert cli.main(["topology", "generate", "--nodes", "8", "--out", str(tmp_path / "f.json")]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"starpulse topology generate: --out {tmp_path / 'f.json'}: ")

    def test_a_bug_keeps_its_traceback_and_its_own_exit_code(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No catch-all hiding bugs: the traceback is logged and the exit code is EXIT_BUG, not 2."""
        from starpulse.app import cli

        def broken(args: object) -> int:
            raise ZeroDivisionError("a bug")

        monkeypatch.setattr(cli.query, "cmd_events", broken)
        assert cli.main(["events"]) == cli.EXIT_BUG != 2
        err = capsys.readouterr().err
        assert "Traceback" in err and "ZeroDivisionError: a bug" in err
        assert err.splitlines()[-1] == "starpulse events: internal error (a bug: its traceback is in the log above)"


class TestQuietlyWrong:
    """What used to print nothing or a false all-clear now says what is missing, exit 2."""

    async def test_events_of_an_unknown_node(self, controller: Controller) -> None:
        address = f"127.0.0.1:{controller.grpc_port}"
        await _still_serving(controller)  # node-001 is known (and quiet)
        out = await asyncio.to_thread(_starpulse, "events", "--controller", address, "--node", "nosuch")
        assert _one_line(out) == (
            f"starpulse events: --node nosuch: no such node at the controller {address} (1 known; see starpulse nodes)"
        )
        out = await asyncio.to_thread(_starpulse, "events", "--controller", address, "--node", "node-001")
        assert out.returncode == 0 and out.stderr == "", out.stderr

    async def test_topology_without_a_fabric_is_no_all_clear(self, controller: Controller) -> None:
        address = f"127.0.0.1:{controller.grpc_port}"
        out = await asyncio.to_thread(_starpulse, "topology", "show", "--controller", address)
        assert _one_line(out).startswith(f"starpulse topology show: the controller at {address} has no declared fabric")
        assert "wiring matches" not in out.stdout


class TestConfigCheckReferences:
    """`config check` loads the files a controller's settings name and looks for the tools they need."""

    def test_missing_and_broken_files(self, tmp_path: Path) -> None:
        (tmp_path / "rules.yaml").write_text("rules: [\n")
        path = tmp_path / "controller.yaml"
        path.write_text("fabric:\n  path: nosuch.json\ndetection:\n  rules_path: rules.yaml\n")
        out = _starpulse("config", "check", str(path))
        assert out.returncode == 2 and out.stderr == "", out.stderr
        fabric, rules = out.stdout.splitlines()
        assert fabric == f"{path}: fabric.path: {tmp_path / 'nosuch.json'}: cannot read: No such file or directory"
        assert rules.startswith(f"{path}: detection.rules_path: {tmp_path / 'rules.yaml'}: not valid YAML")

    def test_missing_policy_file(self, tmp_path: Path) -> None:
        path = tmp_path / "controller.yaml"
        path.write_text(
            "heal:\n  enabled: true\n  policy_path: policy.yaml\n  scheduler:\n    type: sim\n    sim:\n"
            "      nodes: [node-001]\n"
        )
        out = _starpulse("config", "check", str(path))
        assert out.returncode == 2, out.stdout
        assert out.stdout.splitlines() == [
            f"{path}: heal.policy_path: {tmp_path / 'policy.yaml'}: cannot read policy file: No such file or directory"
        ]

    def test_slurm_healing_without_its_commands(self, tmp_path: Path) -> None:
        """Both `config check` and the controller itself refuse Slurm healing where scontrol is absent."""
        (tmp_path / "bin").mkdir()
        path = tmp_path / "controller.yaml"
        path.write_text(
            f"heal:\n  enabled: true\n  scheduler:\n    type: slurm\n    slurm:\n      bin_dir: {tmp_path / 'bin'}\n"
        )
        line = (
            f"{path}: heal.scheduler.slurm: scontrol, sinfo, squeue, scancel not found in {tmp_path / 'bin'}: "
            "Slurm healing needs its client commands"
        )
        out = _starpulse("config", "check", str(path))
        assert out.returncode == 2 and out.stdout.splitlines() == [line]
        out = _starpulse("controller", "--config", str(path), "--db", str(tmp_path / "c.db"))
        assert _one_line(out) == f"starpulse controller: {line}"

    def test_slurm_commands_on_path_are_found(self, tmp_path: Path) -> None:
        """The same check passes when the four commands are executables in bin_dir (not the quiet default)."""
        (tmp_path / "bin").mkdir()
        for tool in ("scontrol", "sinfo", "squeue", "scancel"):
            exe = tmp_path / "bin" / tool
            exe.write_text("#!/bin/sh\nexit 0\n")
            exe.chmod(0o755)
        path = tmp_path / "controller.yaml"
        path.write_text(
            f"heal:\n  enabled: true\n  scheduler:\n    type: slurm\n    slurm:\n      bin_dir: {tmp_path / 'bin'}\n"
        )
        out = _starpulse("config", "check", str(path))
        assert out.returncode == 0 and out.stdout.startswith("ok: controller:"), out.stdout

    def test_reach_asks_etcd(self, tmp_path: Path) -> None:
        """--reach connects to the etcd endpoints; without it the file alone is checked."""
        port = free_port()
        path = tmp_path / "controller.yaml"
        path.write_text(f"ha:\n  enabled: true\n  etcd: ['127.0.0.1:{port}']\n")
        assert _starpulse("config", "check", str(path)).returncode == 0
        out = _starpulse("config", "check", "--reach", str(path))
        assert out.returncode == 2
        assert out.stdout.splitlines() == [f"{path}: ha.etcd: 127.0.0.1:{port}: unreachable (Connection refused)"]


class TestTables:
    """The text tables have a header row, so a reader knows which column is which."""

    async def test_incidents_table_has_a_header(self, controller: Controller) -> None:
        from controller.detect.model import Incident

        controller.detection.incidents.open(
            Incident(
                id="", kind="gpu_fault", root_cause="node-000/gpu-3", component_type="gpu",
                affected_nodes=["node-000"], affected_jobs=[], severity="critical", action="drain",
                evidence=[], opened_ms=int(time.time() * 1000),
            )
        )  # fmt: skip
        out = await asyncio.to_thread(_starpulse, "incidents", "--controller", f"127.0.0.1:{controller.grpc_port}")
        assert out.returncode == 0, out.stderr
        header, row = out.stdout.splitlines()
        assert header.split() == ["INCIDENT", "STATE", "SEVERITY", "KIND", "ROOT", "CAUSE", "ACTION", "OPENED", "NODES"]
        assert row.split()[1:5] == ["open", "critical", "gpu_fault", "node-000/gpu-3"]
