"""The systemd units in deploy/systemd: valid for systemd, hardened, and in step with the CLI."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from starpulse.app.cli import build_parser, cmd_agent, cmd_controller, cmd_relay

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
AGENT = UNITS / "starpulse-agent.service"
CONTROLLER = UNITS / "starpulse-controller.service"
RELAY = UNITS / "starpulse-relay.service"
INSTALLED_BINARY = "/usr/local/bin/starpulse"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """section -> key -> values in order (continuation lines joined, comments dropped)."""
    unit: Unit = {}
    section = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        unit[section].setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section].get(key)
    assert values, f"{key}= missing from [{section}]"
    return values[-1]


@pytest.fixture(params=[AGENT, CONTROLLER, RELAY], ids=["agent", "controller", "relay"])
def unit(request: pytest.FixtureRequest) -> Unit:
    return parse_unit(request.param)


def test_notify_watchdog_restart(unit: Unit) -> None:
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    assert one(unit, "WatchdogSec") == "30"
    assert one(unit, "Restart") == "always"
    assert one(unit, "RestartSec") == "2"
    assert one(unit, "TimeoutStopSec") == "30"
    assert one(unit, "StartLimitIntervalSec", "Unit") == "0"  # never give up restarting
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_hardening(unit: Unit) -> None:
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "SystemCallArchitectures": "native",
    }.items():
        assert one(unit, key) == value, key
    assert "MemoryDenyWriteExecute" in unit["Service"], "state the W^X choice explicitly"


@pytest.mark.parametrize("path", [AGENT, CONTROLLER], ids=["agent", "controller"])
def test_stateful_units_write_only_their_state_folder(path: Path) -> None:
    unit = parse_unit(path)
    assert unit["Service"].get("ReadWritePaths")
    assert unit["Service"].get("StateDirectory")


def test_relay_is_unprivileged_and_stateless() -> None:
    unit = parse_unit(RELAY)
    assert one(unit, "User") == "starpulse"
    assert one(unit, "CapabilityBoundingSet") == ""
    assert one(unit, "MemoryDenyWriteExecute") == "yes"
    assert "ReadWritePaths" not in unit["Service"] and "StateDirectory" not in unit["Service"]


def test_environment_file_is_optional_and_under_etc(unit: Unit) -> None:
    env_file = one(unit, "EnvironmentFile")
    assert env_file.startswith("-/etc/starpulse/") and env_file.endswith(".env")


def test_agent_devices_and_capabilities() -> None:
    unit = parse_unit(AGENT)
    svc = unit["Service"]
    assert one(unit, "DevicePolicy") == "closed"
    allowed = svc["DeviceAllow"]
    for device in ("/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "char-nvidia-frontend rw", "/dev/kmsg r"):
        assert device in allowed, device
    # CAP_SYS_PTRACE: py-spy reads a hung job's stacks and the agent reaches the ranks' flight
    # recorder through /proc/PID/root, so its own /tmp stays private (issue 27).
    assert one(unit, "CapabilityBoundingSet").split() == ["CAP_SYSLOG", "CAP_SYS_PTRACE"]
    assert one(unit, "AmbientCapabilities").split() == ["CAP_SYSLOG", "CAP_SYS_PTRACE"]
    assert one(unit, "PrivateTmp") == "yes"
    assert "ProtectProc" not in svc, "ProtectProc=invisible would hide the ranks' /proc/PID from the agent"
    assert "/var/lib/starpulse" in svc["ReadWritePaths"]
    assert one(unit, "StateDirectory") == "starpulse"
    assert one(unit, "RuntimeDirectory") == "starpulse"
    assert "ProtectKernelLogs" not in svc, "ProtectKernelLogs=yes would hide /dev/kmsg from the agent"
    # The watchdog is pinged once per cycle: the default interval must fit twice into it.
    assert float(_env_default(unit, "STARPULSE_INTERVAL_S")) * 2 < float(one(unit, "WatchdogSec"))


def test_controller_runs_unprivileged() -> None:
    unit = parse_unit(CONTROLLER)
    assert one(unit, "User") == "starpulse"
    assert one(unit, "CapabilityBoundingSet") == ""
    assert one(unit, "PrivateDevices") == "yes"
    assert one(unit, "MemoryDenyWriteExecute") == "yes"
    assert one(unit, "MemoryMax")
    assert "/var/lib/starpulse-controller" in unit["Service"]["ReadWritePaths"]


def _env_default(unit: Unit, name: str) -> str:
    for assignment in unit["Service"].get("Environment", []):
        key, _, value = assignment.partition("=")
        if key == name:
            return value
    raise AssertionError(f"no Environment={name}= default")


def exec_argv(unit: Unit, env: dict[str, str] | None = None) -> list[str]:
    """ExecStart as systemd would run it with the unit's defaults (and env) and an empty args variable."""
    values = {k: v for a in unit["Service"].get("Environment", []) for k, _, v in [a.partition("=")]}
    values.update(env or {})
    argv: list[str] = []
    for word in shlex.split(one(unit, "ExecStart")):
        whole = re.fullmatch(r"\$\{?(\w+)\}?", word)
        if whole and not word.startswith("${"):
            argv.extend(values.get(whole.group(1), "").split())  # $VAR: split on whitespace
            continue
        expanded = re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), ""), word)
        argv.append(expanded.replace("%H", "node-001.example.internal"))
    return argv


def test_agent_exec_start_matches_the_cli() -> None:
    argv = exec_argv(parse_unit(AGENT))
    assert argv[0] == INSTALLED_BINARY
    args = build_parser().parse_args(argv[1:])
    assert args.func is cmd_agent
    assert args.backend == "nvml" and args.state_dir == "/var/lib/starpulse"
    assert args.job_socket == "/run/starpulse/jobs.sock" and args.metrics == "0.0.0.0:9464"
    assert args.node_id == "node-001.example.internal"
    assert args.controller == ["127.0.0.1:50051"]
    extra = exec_argv(parse_unit(AGENT), {"STARPULSE_AGENT_ARGS": "--mount / --mount /raid", "STARPULSE_METRICS": ""})
    args = build_parser().parse_args(extra[1:])
    assert args.mount == ["/", "/raid"] and not args.metrics


def test_controller_exec_start_matches_the_cli() -> None:
    argv = exec_argv(parse_unit(CONTROLLER))
    assert argv[0] == INSTALLED_BINARY
    args = build_parser().parse_args(argv[1:])
    assert args.func is cmd_controller
    assert args.db == "/var/lib/starpulse-controller/controller.db"
    assert args.listen == "0.0.0.0:50051"


def test_relay_exec_start_matches_the_cli() -> None:
    argv = exec_argv(parse_unit(RELAY))
    assert argv[0] == INSTALLED_BINARY
    args = build_parser().parse_args(argv[1:])
    assert args.func is cmd_relay
    assert args.relay_id == "node-001.example.internal"
    assert args.controller == ["127.0.0.1:50051"] and args.listen == "0.0.0.0:50051"
    assert args.metrics == "0.0.0.0:9465"
    extra = exec_argv(parse_unit(RELAY), {"STARPULSE_RELAY_ARGS": "--linger-ms 5", "STARPULSE_METRICS": ""})
    args = build_parser().parse_args(extra[1:])
    assert args.linger_ms == 5.0 and not args.metrics


@pytest.mark.parametrize("name", ["agent", "controller", "relay"])
def test_example_env_files_set_only_what_the_unit_reads(name: str) -> None:
    unit_text = (UNITS / f"starpulse-{name}.service").read_text()
    env = UNITS / f"starpulse-{name}.env"
    names = set()
    for raw in env.read_text().splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not re.match(r"#STARPULSE_\w+=", line)):
            continue
        key = line.lstrip("#").partition("=")[0]
        assert re.fullmatch(r"STARPULSE_[A-Z_]+", key), f"{env.name}: {line!r}"
        names.add(key)
    assert names
    for key in names:
        assert f"${{{key}}}" in unit_text or f"${key}" in unit_text, f"{key} is not used by the unit"


def _verify_binary() -> str:
    """Any existing executable will do: systemd-analyze verify checks ExecStart= is executable."""
    beside = Path(sys.executable).parent / "starpulse"
    return str(beside) if beside.exists() else sys.executable


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install --no-install-recommends systemd)")
    copies = []
    for path in (AGENT, CONTROLLER, RELAY):
        copy = tmp_path / path.name
        copy.write_text(path.read_text().replace(INSTALLED_BINARY, _verify_binary()))
        copies.append(str(copy))
    res = subprocess.run([tool, "verify", *copies], capture_output=True, text=True, timeout=120, check=False)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    # verify exits 0 on unknown keys and unparsable values (it only warns): fail on those too.
    ours = [line for line in output.splitlines() if "starpulse-" in line]
    assert not ours, "\n".join(ours)
