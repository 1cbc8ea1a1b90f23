"""The `starpulse` command as a user runs it: subprocesses, real output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import free_port, shared_fixture

STARPULSE = [sys.executable, "-m", "starpulse.app.cli"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STARPULSE, *args], capture_output=True, text=True, timeout=timeout, check=False)


class TestScan:
    def test_sim_scan_json_has_inventory_sample_and_findings(self) -> None:
        """`scan --backend sim --json`: 8 GPUs, 9 NIC ports, a full sample, no findings on healthy hardware."""
        out = run("scan", "--backend", "sim", "--json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert set(data) == {"schema", "inventory", "sample", "findings", "verdict"}
        assert data["schema"] == "starpulse.v1/scan"
        assert data["verdict"]["status"] == "healthy" and data["verdict"]["conditions"] == []
        assert len(data["inventory"]["gpus"]) == 8
        assert len(data["inventory"]["nics"]) == 9
        assert len(data["sample"]["gpus"]) == 8
        assert data["findings"] == []

    def test_scan_reads_a_kernel_log_file(self, tmp_path: Path) -> None:
        """Xid lines in a dmesg file become findings with xid (int), pci as logged, and the catalog action."""
        log = tmp_path / "dmesg.txt"
        log.write_text(
            "[  100.000001] NVRM: Xid (PCI:0000:9b:00): 79, pid=0, name=<unknown>, GPU has fallen off the bus.\n"
            "[  101.000001] NVRM: Xid (PCI:0000:18:00): 13, pid=77, name=python3, Graphics Exception\n"
        )
        out = run("scan", "--backend", "sim", "--kmsg", str(log), "--json")
        assert out.returncode == 1  # critical findings: non-zero, like a health check should
        findings = {f["xid"]: f for f in json.loads(out.stdout)["findings"] if f["kind"] == "xid"}
        assert findings[79]["action"] == "reboot" and findings[79]["pci"] == "0000:9b:00"
        assert findings[13]["action"] == "restart_app"
        assert {"kind", "component", "severity", "action", "message"} <= set(findings[79])

    def test_nvml_backend_without_driver_fails_in_one_clear_line(self) -> None:
        """On a machine without the NVIDIA driver, `--backend nvml` says so and exits non-zero: no silent fallback."""
        out = run("scan", "--backend", "nvml", "--json")
        assert out.returncode == 2
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "NVML" in lines[0] and "Library Not Found" in lines[0]
        assert out.stdout == ""

    def test_controller_refuses_negative_detect_workers(self, tmp_path: Path) -> None:
        out = run("controller", "--detect-workers", "-1", "--db", str(tmp_path / "c.db"))
        assert out.returncode == 2
        assert "--detect-workers" in out.stderr and "Traceback" not in out.stderr

    def test_agent_with_nvml_backend_without_driver_exits(self, tmp_path: Path) -> None:
        """The agent refuses to start on `nvml` without a driver rather than running with no GPU data."""
        out = run(
            "agent",
            "--controller",
            "127.0.0.1:1",
            "--node-id",
            "node-000",
            "--backend",
            "nvml",
            "--state-dir",
            str(tmp_path),
        )
        assert out.returncode == 2
        assert "NVML" in out.stderr.strip().splitlines()[-1]


class TestServices:
    def test_controller_agent_nodes_and_events(self, tmp_path: Path) -> None:
        """A controller and a sim agent as processes; `nodes` and `events` show the node and its events."""
        grpc_port = free_port()
        controller_log = (tmp_path / "controller.log").open("w")
        agent_log = (tmp_path / "agent.log").open("w")
        controller = subprocess.Popen(
            [
                *STARPULSE,
                "controller",
                "--listen",
                f"127.0.0.1:{grpc_port}",
                "--http",
                "127.0.0.1:0",
                "--db",
                str(tmp_path / "c.db"),
            ],
            stdout=controller_log,
            stderr=subprocess.STDOUT,
        )
        agent = subprocess.Popen(
            [
                *STARPULSE,
                "agent",
                "--controller",
                f"127.0.0.1:{grpc_port}",
                "--node-id",
                "node-007",
                "--backend",
                "sim",
                "--interval-s",
                "0.5",
                "--state-dir",
                str(tmp_path / "agent"),
            ],
            stdout=agent_log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            nodes: list[dict[str, object]] = []
            while time.monotonic() < deadline:
                out = run("nodes", "--controller", f"127.0.0.1:{grpc_port}", "--json")
                if out.returncode == 0:
                    nodes = json.loads(out.stdout)["nodes"]
                    if nodes:
                        break
                time.sleep(0.3)
            assert nodes and nodes[0]["node_id"] == "node-007"
            assert nodes[0]["state"] == "online" and nodes[0]["gpu_count"] == 8
            # the sim writes its kernel log under the agent's state dir
            kmsg = tmp_path / "agent" / "sim" / "kmsg"
            with kmsg.open("a") as fh:
                fh.write("3,99999,4000000000,-;NVRM: Xid (PCI:0000:0b:00): 95, pid=1, name=train, Uncontained\n")
            deadline = time.monotonic() + 20
            events: list[dict[str, object]] = []
            while time.monotonic() < deadline and not events:
                out = run("events", "--controller", f"127.0.0.1:{grpc_port}", "--json")
                events = [e for e in json.loads(out.stdout)["events"] if e["xid"] == 95]
                time.sleep(0.3)
            assert events and events[0]["action"] == "reset_gpu" and events[0]["component"] == "gpu-0"
            table = run("nodes", "--controller", f"127.0.0.1:{grpc_port}")
            assert "node-007" in table.stdout and "online" in table.stdout
        finally:
            for proc in (agent, controller):
                proc.send_signal(signal.SIGTERM)
            for proc in (agent, controller):
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    pytest.fail(f"{proc.args[3]} did not stop on SIGTERM")
            controller_log.close()
            agent_log.close()
        assert agent.returncode == 0 and controller.returncode == 0

    def test_agent_through_a_relay_process(self, tmp_path: Path) -> None:
        """controller, relay and agent as processes: the node shows up; the relay stops cleanly on SIGTERM."""
        grpc_port, relay_port = free_port(), free_port()
        logs = [(tmp_path / f"{n}.log").open("w") for n in ("controller", "relay", "agent")]
        procs = [
            subprocess.Popen(
                [
                    *STARPULSE,
                    "controller",
                    "--listen",
                    f"127.0.0.1:{grpc_port}",
                    "--http",
                    "127.0.0.1:0",
                    "--db",
                    str(tmp_path / "c.db"),
                ],
                stdout=logs[0],
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [
                    *STARPULSE,
                    "relay",
                    "--controller",
                    f"127.0.0.1:{grpc_port}",
                    "--relay-id",
                    "relay-1",
                    "--listen",
                    f"127.0.0.1:{relay_port}",
                ],
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [
                    *STARPULSE,
                    "agent",
                    "--controller",
                    f"127.0.0.1:{relay_port}",
                    "--node-id",
                    "node-007",
                    "--backend",
                    "sim",
                    "--interval-s",
                    "0.5",
                    "--state-dir",
                    str(tmp_path / "agent"),
                ],
                stdout=logs[2],
                stderr=subprocess.STDOUT,
            ),
        ]
        try:
            deadline = time.monotonic() + 40
            nodes: list[dict[str, object]] = []
            while time.monotonic() < deadline and not nodes:
                out = run("nodes", "--controller", f"127.0.0.1:{grpc_port}", "--json")
                if out.returncode == 0:
                    nodes = json.loads(out.stdout)["nodes"]
                time.sleep(0.3)
            assert nodes and nodes[0]["node_id"] == "node-007" and nodes[0]["state"] == "online"
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    pytest.fail(f"{proc.args[3]} did not stop on SIGTERM")
            for log in logs:
                log.close()
        assert [p.returncode for p in procs] == [0, 0, 0]
        relay_log = (tmp_path / "relay.log").read_text()
        assert "relay_upstream_connected" in relay_log and "relay_stopped" in relay_log

    def test_relay_bad_arguments_are_one_line(self, tmp_path: Path) -> None:
        out = run("relay", "--relay-id", "r1")
        assert out.returncode == 2 and "--controller" in out.stderr and "Traceback" not in out.stderr
        out = run("relay", "--relay-id", "r1", "--controller", "127.0.0.1:1", "--tls-ca", str(tmp_path / "ca.pem"))
        assert out.returncode == 2 and "go together" in out.stderr and "Traceback" not in out.stderr

    def test_unreachable_controller_is_a_clear_error(self) -> None:
        """`nodes` against a dead address fails with exit 2 and the gRPC status, not a traceback."""
        out = run("nodes", "--controller", f"127.0.0.1:{free_port()}")
        assert out.returncode == 2 and "UNAVAILABLE" in out.stderr and "Traceback" not in out.stderr

    def test_version(self) -> None:
        """`starpulse version` prints the package version."""
        out = run("version")
        assert out.returncode == 0 and out.stdout.startswith("starpulse ")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # gRPC honours http_proxy; loopback tests must never go through one.
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"


class TestSwitchAgent:
    @pytest.mark.parametrize("tables", ["recorded", "generated"])
    def test_switch_role_streams_sonic_ports_to_the_controller(self, tmp_path: Path, tables: str) -> None:
        """`agent --role switch` reads a real Redis holding SONiC's tables and the controller sees its ports.

        The tables are the recorded sonic-utilities ones (skipped where ../shared is absent) or a
        FakeSwitch's; both have a queue in PFC-watchdog "stormed" state.
        """
        import shutil

        import redis

        from agent.sim.fake_switch import FakeSwitch, load_sonic_fixture

        recorded = shared_fixture("sonic") if tables == "recorded" else None
        server = shutil.which("redis-server")
        if server is None:
            pytest.skip("redis-server binary not found (apt-get install redis-server)")
        redis_port, grpc_port = free_port(), free_port()
        procs = [
            subprocess.Popen(
                [server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    if redis.Redis(port=redis_port).ping():
                        break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            clients: dict[int, redis.Redis] = {}

            def client(db: int) -> redis.Redis:
                """One client per SONiC db (FakeSwitch asks for one on every write)."""
                if db not in clients:
                    clients[db] = redis.Redis(port=redis_port, db=db, decode_responses=True)
                return clients[db]

            if recorded is not None:
                load_sonic_fixture(client, recorded)
            else:
                switch = FakeSwitch(client, "leaf-b0-r0", ports=4)
                switch.install()
                switch.pfc_storm("Ethernet4")
            with (tmp_path / "c.log").open("w") as clog, (tmp_path / "a.log").open("w") as alog:
                procs.append(
                    subprocess.Popen(
                        [
                            *STARPULSE,
                            "controller",
                            "--listen",
                            f"127.0.0.1:{grpc_port}",
                            "--http",
                            "127.0.0.1:0",
                            "--db",
                            str(tmp_path / "c.db"),
                        ],
                        stdout=clog,
                        stderr=subprocess.STDOUT,
                    )
                )
                procs.append(
                    subprocess.Popen(
                        [
                            *STARPULSE,
                            "agent",
                            "--role",
                            "switch",
                            "--node-id",
                            "leaf-b0-r0",
                            "--controller",
                            f"127.0.0.1:{grpc_port}",
                            "--redis",
                            f"127.0.0.1:{redis_port}",
                            "--interval-s",
                            "0.5",
                            "--state-dir",
                            str(tmp_path / "agent"),
                        ],
                        stdout=alog,
                        stderr=subprocess.STDOUT,
                    )
                )
            deadline = time.monotonic() + 30
            events: list[dict[str, object]] = []
            while time.monotonic() < deadline and not events:
                out = run("events", "--controller", f"127.0.0.1:{grpc_port}", "--json")
                if out.returncode == 0:
                    events = [e for e in json.loads(out.stdout)["events"] if e["node"] == "leaf-b0-r0"]
                time.sleep(0.3)
            # Both sets of tables have queues in PFC-watchdog "stormed" state: the switch agent reports them.
            assert any(e["kind"] == "pfc_storm" for e in events), events
            nodes = json.loads(run("nodes", "--controller", f"127.0.0.1:{grpc_port}", "--json").stdout)["nodes"]
            assert nodes[0]["node_id"] == "leaf-b0-r0" and nodes[0]["role"] == "switch"
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
