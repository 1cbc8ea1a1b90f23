"""Service config files: schema errors, environment overrides, precedence, deploy examples, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from starpulse.app import cli
from starpulse.app.config import KINDS, ConfigError, check_file, example, service
from starpulse.app.config.agent import load_agent_config
from starpulse.app.config.controller import load_controller_config, load_controller_settings
from starpulse.app.config.relay import load_relay_settings

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
AGENT_MIN = {"agent": {"node_id": "node-001", "controllers": ["127.0.0.1:50051"]}}


@pytest.fixture(autouse=True)
def _quiet_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Services reconfigure logging onto pytest's captured stdout; later tests would write to it closed."""
    monkeypatch.setattr("starpulse.core.logs.configure_logging", lambda *a, **k: None)


def write(tmp_path: Path, data: Any, name: str = "controller.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def errors_of(fn: Any, *args: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value.errors


# -- schema errors ----------------------------------------------------------------------------
CONTROLLER_ERRORS = [
    ({"ha": {"lease_ttl_s": 1}}, "ha.lease_ttl_s: must be an integer >= 2 and <= 60, got 1"),
    ({"ha": {"enabled": True, "advertise": "nowhere"}}, "ha.advertise: must be HOST:PORT or empty, got 'nowhere'"),
    ({"ha": {"enabled": True, "cluster": "a/b"}}, "ha: ha.cluster must be a non-empty name without '/', got 'a/b'"),
    ({"ingest": {"heartbeat_timeout_s": "soon"}}, "ingest.heartbeat_timeout_s: must be a number > 0, got 'soon'"),
    ({"ingest": {"heartbeat_timeout_s": 0}}, "ingest.heartbeat_timeout_s: must be a number > 0, got 0"),
    ({"ingest": {"heartbeat_timeout_s": None}}, "ingest.heartbeat_timeout_s: must be a number > 0, got null"),
    ({"ingest": {"max_message_bytes": 1.5}}, "ingest.max_message_bytes: must be an integer >= 1024, got 1.5"),
    ({"ingest": {"max_message_bytes": True}}, "ingest.max_message_bytes: must be an integer >= 1024, got True"),
    ({"ingest": {"report_interval_s": -1}}, "ingest.report_interval_s: must be a number >= 0, got -1"),
    (
        {"detection": {"correlation": {"partition_fleet_share": 1.5}}},
        "detection.correlation.partition_fleet_share: must be a number > 0 and <= 1, got 1.5",
    ),
    (
        {"detection": {"failslow": {"signals": ["power_w", "bogus"]}}},
        "detection.failslow.signals[1]: must be one of sm_clock_mhz, power_w, gpu_util_pct, "
        "nic_gbps, step_time_s, got 'bogus'",
    ),
    (
        {"detection": {"failslow": {"job_ttl_s": "1h"}}},
        "detection.failslow.job_ttl_s: must be a number > 0, or null, got '1h'",
    ),
    (
        {"detection": {"failslow": {"window_s": 60, "sample_every_s": 30}}},
        "detection.failslow: a window_s of 60 s sampled every 30 s holds fewer than min_samples (5): "
        "nobody would ever be compared",
    ),
    ({"heal": {"guards": {"mode": "yolo"}}}, "heal.guards.mode: must be one of enforce, dry_run, manual, got 'yolo'"),
    (
        {"heal": {"scheduler": {"type": "pbs"}}},
        "heal.scheduler.type: must be one of slurm, kubernetes, exec, sim, got 'pbs'",
    ),
    ({"heal": {"enabled": "yes"}}, "heal.enabled: must be true or false, got 'yes'"),
    ({"server": {"listen": "nowhere"}}, "server.listen: must be HOST:PORT, got 'nowhere'"),
    ({"server": {"listen": "host:99999"}}, "server.listen: must be HOST:PORT, got 'host:99999'"),
    ({"server": {"controller_id": " "}}, "server.controller_id: must be a non-empty string, got ' '"),
    ({"server": {"db_path": 5}}, "server.db_path: must be a path, got 5"),
    (
        {"fabric": {"jobs": {"j1": "node-1"}}},
        "fabric.jobs.j1: must be a non-empty list, each a non-empty string, got 'node-1'",
    ),
    (
        {"ingest": {"heartbeat_timout_s": 3}},
        "ingest.heartbeat_timout_s: unknown key, did you mean 'heartbeat_timeout_s'?",
    ),
    ({"ingets": {}}, "ingets: unknown key, did you mean 'ingest'?"),
    ({"frobnicate": 1}, "frobnicate: unknown key"),
    ({"ingest": 5}, "ingest: must be a mapping, got 5"),
    ({"notify": {"receivers": "x"}}, "notify.receivers: must be a list of mappings, got 'x'"),
    ({"notify": {"recievers": []}}, "notify: unknown key 'recievers'"),
    (
        {"tls": {"ca_file": "ca.pem"}},
        "tls: set all of ca_file, cert_file and key_file or none; missing cert_file, key_file",
    ),
    (
        {"detection": {"workers": -1}},
        "detection.workers: must be an integer >= 0 and <= 64, got -1",
    ),
    (
        {"heal": {"enabled": True, "scheduler": {"type": "sim"}}},
        "heal.scheduler.sim.nodes: is required when fabric.path is not set",
    ),
    (
        {"heal": {"enabled": True, "scheduler": {"type": "exec", "exec": {"hooks": {"explode": ["/bin/true"]}}}}},
        "heal.scheduler.exec: unknown hook actions ['explode']; known: ('cordon', 'drain', 'resume', 'requeue', "
        "'signal_job', 'node_status', 'job_nodes', 'list_nodes')",
    ),
]


@pytest.mark.parametrize(("data", "message"), CONTROLLER_ERRORS, ids=[m.split(":")[0] for _, m in CONTROLLER_ERRORS])
def test_controller_errors_name_file_and_key(tmp_path: Path, data: dict[str, Any], message: str) -> None:
    path = write(tmp_path, data)
    errors = errors_of(load_controller_settings, path, {})
    if message.startswith("notify: unknown key"):  # the notify parser words its own messages
        assert len(errors) == 1 and errors[0].startswith(f"{path}: notify"), errors
        assert "recievers" in errors[0]
        return
    assert errors == [f"{path}: {message}"]


AGENT_ERRORS = [
    ({}, ["agent.node_id: is required", "agent.controllers: is required"]),
    (
        {"agent": {"node_id": "node-001", "controllers": []}},
        ["agent.controllers: must be a non-empty list of HOST:PORT, got []"],
    ),
    (
        {**AGENT_MIN, "hardware": {"backend": "rocm"}},
        ["hardware.backend: must be one of nvml, amd, ascend, sim, got 'rocm'"],
    ),
    ({**AGENT_MIN, "hardware": {"seed": -1}}, ["hardware.seed: must be an integer >= 0, got -1"]),
    ({**AGENT_MIN, "hardware": {"mounts": "/"}}, ["hardware.mounts: must be a list of strings, got '/'"]),
    ({**AGENT_MIN, "metrics": {"listen": ":x"}}, ["metrics.listen: must be HOST:PORT, or null, got ':x'"]),
    (
        {**AGENT_MIN, "jobs": {"allowed_commands": {"format_disk": ["/sbin/mkfs"]}}},
        [
            "jobs.allowed_commands: unknown command kinds ['format_disk']; "
            "configurable: gpu_reset, reboot, run_diagnostic, diagnostic.NAME"
        ],
    ),
    ({**AGENT_MIN, "server": {}}, ["server: unknown key"]),
]


@pytest.mark.parametrize(("data", "messages"), AGENT_ERRORS, ids=[m[0].split(":")[0] for _, m in AGENT_ERRORS])
def test_agent_errors(tmp_path: Path, data: dict[str, Any], messages: list[str]) -> None:
    path = write(tmp_path, data, "agent.yaml")
    assert errors_of(load_agent_config, path, {}) == [f"{path}: {m}" for m in messages]


def test_bad_node_id_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, {"agent": {"node_id": "bad node!", "controllers": ["c:1"]}}, "agent.yaml")
    (err,) = errors_of(load_agent_config, path, {})
    assert err.startswith(f"{path}: agent.node_id: ")


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "server": {"listen": "nowhere", "http": 8080},
            "ingest": {"heartbeat_timeout_s": "soon", "rate_burst": 0},
            "heal": {"guards": {"mode": "yolo", "flap_max": 0}},
            "log": {"level": "loud"},
        },
    )
    assert len(errors_of(load_controller_settings, path, {})) == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server: [1, 2\n", "not valid YAML at line 2"),
        ("- a\n- b\n", "must be a mapping of sections, got ['a', 'b']"),
    ],
)
def test_unreadable_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    (err,) = errors_of(load_controller_settings, path, {})
    assert err.startswith(f"{path}: {message}")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert errors_of(load_controller_settings, path, {}) == [f"{path}: cannot read: No such file or directory"]


def test_empty_file_is_all_defaults_and_toml_works(tmp_path: Path) -> None:
    cfg = load_controller_config(write(tmp_path, ""), {})
    assert cfg.listen == "127.0.0.1:50051" and cfg.heartbeat_timeout_s == 15.0 and cfg.heal is None
    assert cfg.db_path == Path("starpulse.db")  # a default stays relative to the working directory
    toml = write(tmp_path, '[ingest]\nheartbeat_timeout_s = 30\n[heal.guards]\nmode = "manual"\n', "c.toml")
    cfg = load_controller_config(toml, {})
    assert cfg.heartbeat_timeout_s == 30.0


# -- environment overrides ------------------------------------------------------------------
def test_env_overrides_valid(tmp_path: Path) -> None:
    path = write(tmp_path, {"ingest": {"heartbeat_timeout_s": 10}})
    env = {
        "STARPULSE_INGEST__HEARTBEAT_TIMEOUT_S": "30",
        "STARPULSE_INGEST__MAX_MESSAGE_BYTES": "8388608",
        "STARPULSE_SERVER__LISTEN": "0.0.0.0:6000",
        "STARPULSE_SERVER__DB_PATH": "rel/state.db",
        "STARPULSE_FABRIC__ALLOWED_NODES": "node-001, node-002",
        "STARPULSE_DETECTION__CORRELATION__SETTLE_S": "0.5",
        "STARPULSE_DETECTION__FAILSLOW__SIGNALS": "[power_w, step_time_s]",
        "STARPULSE_NOTIFY__EXTERNAL_URL": "http://ctl:8080/",
        "STARPULSE_NOTIFY__BATCH_SIZE": "7",
        "STARPULSE_AGENT__NODE_ID": "not-this-service",  # another service's section: ignored
        "STARPULSE_JOB_SOCKET": "/run/x.sock",  # not an override (no double underscore)
    }
    cfg = load_controller_config(path, env)
    assert cfg.heartbeat_timeout_s == 30.0
    assert cfg.max_message_bytes == 8388608
    assert cfg.listen == "0.0.0.0:6000"
    assert cfg.db_path == Path("rel/state.db")  # relative to the working directory, not the file
    assert cfg.allowed_nodes == ["node-001", "node-002"]
    assert cfg.detection.correlation.settle_s == 0.5
    assert cfg.detection.failslow.signals == ("power_w", "step_time_s")
    assert cfg.notify.external_url == "http://ctl:8080" and cfg.notify.batch_size == 7


def test_env_bool_and_null(tmp_path: Path) -> None:
    path = write(tmp_path, {**AGENT_MIN, "metrics": {"listen": "0.0.0.0:9400"}}, "agent.yaml")
    env = {
        "STARPULSE_HARDWARE__ETHTOOL": "false",
        "STARPULSE_METRICS__LISTEN": "",
        "STARPULSE_HARDWARE__KMSG": "null",
        "STARPULSE_AGENT__CONTROLLERS": "a:1,b:2",
    }
    config, opt = load_agent_config(path, env)
    assert opt.ethtool is False and opt.kmsg is None and config.metrics_listen is None
    assert config.controllers == ["a:1", "b:2"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"STARPULSE_INGEST__HEARTBEAT_TIMEOUT_S": "soon"},
            "STARPULSE_INGEST__HEARTBEAT_TIMEOUT_S: ingest.heartbeat_timeout_s: must be a number > 0, got 'soon'",
        ),
        (
            {"STARPULSE_HEAL__GUARDS__MODE": "yolo"},
            "STARPULSE_HEAL__GUARDS__MODE: heal.guards.mode: must be one of enforce, dry_run, manual, got 'yolo'",
        ),
        (
            {"STARPULSE_HEAL__ENABLED": "maybe"},
            "STARPULSE_HEAL__ENABLED: heal.enabled: must be true or false, got 'maybe'",
        ),
        (
            {"STARPULSE_INGEST__HEARTBEAT_TIMOUT_S": "3"},
            "STARPULSE_INGEST__HEARTBEAT_TIMOUT_S: unknown setting ingest.heartbeat_timout_s, "
            "did you mean 'heartbeat_timeout_s'?",
        ),
        (
            {"STARPULSE_INGEST": "x", "STARPULSE_DETECTION__CORRELATION": "1"},
            "STARPULSE_DETECTION__CORRELATION: detection.correlation is a section, not a setting",
        ),
        (
            {"STARPULSE_NOTIFY__BATCH_SIZE": "0"},
            "STARPULSE_NOTIFY__BATCH_SIZE: notify.batch_size: must be an integer >= 1, got 0",
        ),
    ],
)
def test_env_overrides_invalid_name_the_variable(tmp_path: Path, env: dict[str, str], message: str) -> None:
    path = write(tmp_path, {})
    assert errors_of(load_controller_settings, path, env) == [message]


# -- precedence: file < environment < explicit flags ------------------------------------------
def _controller_args(argv: list[str]) -> Any:
    args = cli.build_parser().parse_args(argv)
    args.argv = argv
    return args


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "server": {"listen": "0.0.0.0:1111", "http": "0.0.0.0:2222"},
            "ingest": {"heartbeat_timeout_s": 10, "rate_burst": 100},
            "heal": {"guards": {"mode": "dry_run"}},
        },
    )
    env = {
        "STARPULSE_INGEST__HEARTBEAT_TIMEOUT_S": "20",
        "STARPULSE_SERVER__HTTP": "0.0.0.0:3333",
        "STARPULSE_SERVER__LISTEN": "0.0.0.0:4444",
    }
    # --listen is given at its default value: an explicit flag still wins; --http is not given.
    args = _controller_args(
        ["controller", "--config", str(path), "--listen", "127.0.0.1:50051", "--heartbeat-timeout-s", "30"]
    )
    cfg = load_controller_settings(path, env, cli.overrides(args)).controller
    assert cfg.listen == "127.0.0.1:50051"  # flag > env > file
    assert cfg.heartbeat_timeout_s == 30.0  # flag > env > file
    assert cfg.http == "0.0.0.0:3333"  # env > file
    assert cfg.rate_burst == 100.0  # file > default
    assert cfg.heal is None


def test_flag_values_are_checked_and_named(tmp_path: Path) -> None:
    path = write(tmp_path, {})
    args = _controller_args(["controller", "--config", str(path), "--listen", "nowhere", "--heartbeat-timeout-s", "-1"])
    assert errors_of(load_controller_settings, path, {}, cli.overrides(args)) == [
        "--listen: server.listen: must be HOST:PORT, got 'nowhere'",
        "--heartbeat-timeout-s: ingest.heartbeat_timeout_s: must be a number > 0, got -1.0",
    ]


def test_scheduler_flag_enables_healing(tmp_path: Path) -> None:
    path = write(tmp_path, {"heal": {"scheduler": {"sim": {"nodes": ["node-001", "node-002"]}}}})
    args = _controller_args(["controller", "--config", str(path), "--scheduler", "sim", "--heal-mode", "manual"])
    cfg = load_controller_settings(path, {}, cli.overrides(args)).controller
    assert cfg.heal is not None and cfg.heal.scheduler.name == "sim" and cfg.heal.guards.mode == "manual"
    assert sorted(cfg.heal.scheduler.nodes) == ["node-001", "node-002"]


def test_agent_flags_override_file(tmp_path: Path) -> None:
    path = write(tmp_path, {**AGENT_MIN, "agent": {**AGENT_MIN["agent"], "interval_s": 7}}, "agent.yaml")
    argv = [
        "agent",
        "--config",
        str(path),
        "--node-id",
        "node-009",
        "--controller",
        "x:1,y:2",
        "--kmsg",
        "",
        "--allow-command",
        "reboot=/sbin/reboot",
    ]
    args = cli.build_parser().parse_args(argv)
    args.argv = argv
    config, opt = load_agent_config(path, {"STARPULSE_AGENT__INTERVAL_S": "9"}, cli.overrides(args))
    assert config.node_id == "node-009" and config.controllers == ["x:1", "y:2"]
    assert config.interval_s == 9.0 and opt.kmsg is None
    assert config.allowed_commands == {"reboot": ["/sbin/reboot"]}


# -- the deploy examples: generated from the settings, and every setting in them at its default ----
@pytest.mark.parametrize("kind", KINDS)
def test_deploy_example_is_the_rendered_reference(kind: str) -> None:
    """deploy/KIND.yaml is what `starpulse config example KIND` writes: regenerate it when a setting changes."""
    assert (DEPLOY / f"{kind}.yaml").read_text() == example(kind), (
        f"deploy/{kind}.yaml is stale: python -m starpulse.app.cli config example {kind} > deploy/{kind}.yaml"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_deploy_example_sets_every_setting_to_its_default(kind: str) -> None:
    """Every key in the example is a known setting, every setting is there, each at its default and documented."""
    data = yaml.safe_load((DEPLOY / f"{kind}.yaml").read_text())
    schema = service(kind).SCHEMA
    settings = {leaf.key: leaf for leaf in schema.leaves()}

    def walk(node: Any, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in node.items():
            key = f"{prefix}{k}"
            if key in settings:
                out[key] = v
            else:
                assert isinstance(v, dict), f"{kind}.yaml: {key} is not a setting"
                out.update(walk(v, key + "."))
        return out

    values = walk(data, "")
    assert set(values) == set(settings), f"{kind}.yaml: missing {set(settings) - set(values)}"
    for key, leaf in settings.items():
        if leaf.required:
            continue
        if key == "notify":
            assert values[key]["receivers"] == []
            continue
        default = list(leaf.default) if isinstance(leaf.default, tuple) else leaf.default
        default = str(default) if isinstance(default, Path) else default
        assert values[key] == default, f"{kind}.yaml: {key}: example {values[key]!r} != default {default!r}"
    text = " ".join(line.strip("# ") for line in (DEPLOY / f"{kind}.yaml").read_text().splitlines())
    for leaf in settings.values():
        assert leaf.spec.doc, f"{leaf.key} has no doc"
        assert " ".join(leaf.spec.doc.split()) in text, f"{kind}.yaml does not document {leaf.key}"


def test_deploy_examples_load() -> None:
    cfg = load_controller_config(DEPLOY / "controller.yaml", {})
    assert cfg.heartbeat_timeout_s == 15.0 and cfg.db_path == DEPLOY / "starpulse.db"
    config, opt = load_agent_config(DEPLOY / "agent.yaml", {})
    assert config.node_id == "gpu-node-001" and opt.backend == "nvml"
    relay = load_relay_settings(DEPLOY / "relay.yaml", {}).relay
    assert relay.relay_id == "relay-pod3" and relay.linger_s == 0.02


def test_controller_example_documents_every_notify_key() -> None:
    from controller.outputs.notify.config import BackoffConfig, NotifyConfig, ReceiverConfig

    text = (DEPLOY / "controller.yaml").read_text()
    for cls in (NotifyConfig, ReceiverConfig, BackoffConfig):
        for f in dataclasses.fields(cls):
            assert f"{f.name}:" in text, f"controller.yaml does not document notify {cls.__name__}.{f.name}"


# -- one source: the settings add no default of their own, and show the dataclasses' ---------
def test_no_settings_give_the_service_dataclasses_defaults() -> None:
    """Read with nothing set, the settings build exactly the service configs the dataclasses default to."""
    from agent.runtime import AgentConfig
    from controller.service import ControllerConfig
    from relay.service import RelayConfig

    assert load_controller_config(None, {}) == ControllerConfig()
    node = {"agent.node_id": ("--node-id", "node-001"), "agent.controllers": ("--controller", ["c:1"])}
    config, _ = load_agent_config(None, {}, node)
    assert config == AgentConfig(node_id="node-001", controllers=["c:1"])
    relay = {"relay.relay_id": ("--relay-id", "r1"), "relay.controllers": ("--controller", ["c:1"])}
    assert load_relay_settings(None, {}, relay).relay == RelayConfig(relay_id="r1", controllers=["c:1"])


@pytest.mark.parametrize(
    ("command", "flag", "shown"),
    [
        ("controller", "--heartbeat-timeout-s", "(default: 15)"),  # ControllerConfig.heartbeat_timeout_s
        ("controller", "--heal-mode", "(default: enforce)"),  # GuardConfig.mode
        ("controller", "--ha-lease-ttl", "(default: 5)"),  # HAConfig.lease_ttl_s
        ("agent", "--interval-s", "(default: 5)"),  # AgentConfig.interval_s
        ("agent", "--state-dir", "(default: /var/lib/starpulse)"),  # AgentConfig.buffer_path's folder
        ("relay", "--linger-ms", "(default: 20)"),  # RelayConfig.linger_s, in ms
    ],
)
def test_help_shows_the_dataclass_default(command: str, flag: str, shown: str) -> None:
    """`--help` takes each flag's default from the one dataclass field, in the flag's unit."""
    sub = cli.subparsers(cli.build_parser(command)).choices[command]
    (action,) = [a for a in sub._actions if flag in a.option_strings]
    assert action.help is not None and action.help.replace("%%", "%").endswith(shown), action.help


# -- building: healing, relative paths, the CLI --------------------------------------------------
def test_detection_workers_reach_the_controller(tmp_path: Path) -> None:
    """detection.workers turns detection shards on; the flag does the same for a controller without a file."""
    assert load_controller_config(write(tmp_path, {}), {}).detection.workers == 0
    assert load_controller_config(write(tmp_path, {"detection": {"workers": 3}}), {}).detection.workers == 3


def test_ha_section_and_flags(tmp_path: Path) -> None:
    """ha.enabled builds an HAConfig; without it the controller stays a single SQLite one; --etcd turns it on."""
    assert load_controller_config(write(tmp_path, {}), {}).ha is None
    path = write(tmp_path, {"ha": {"enabled": True, "etcd": ["10.0.0.1:2379"], "lease_ttl_s": 3}})
    ha = load_controller_config(path, {}).ha
    assert ha.etcd == ["10.0.0.1:2379"] and ha.lease_ttl_s == 3 and ha.advertise == ""
    from starpulse.app.cli import build_parser, overrides

    argv = ["controller", "--config", str(path), "--etcd", "e1:2379,e2:2379", "--advertise", "c1:50051"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    ha = load_controller_config(write(tmp_path, {}), {}, overrides(args)).ha
    assert ha.etcd == ["e1:2379", "e2:2379"] and ha.advertise == "c1:50051"


def test_exec_scheduler_and_relative_paths(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "server": {"db_path": "state/starpulse.db"},
            "heal": {
                "enabled": True,
                "policy_path": "policy.yaml",
                "checkpoint_timeout_s": 5,
                "scheduler": {"type": "exec", "exec": {"hooks": {"drain": ["/bin/true"]}, "env": {"X": 1}}},
            },
        },
    )
    cfg = load_controller_config(path, {})
    assert cfg.db_path == tmp_path / "state/starpulse.db"
    assert cfg.heal.scheduler.name == "exec" and cfg.heal.scheduler.env == {"X": "1"}
    assert cfg.heal.policy_path == tmp_path / "policy.yaml" and cfg.heal.heal.checkpoint_timeout_s == 5.0


def test_check_file_summary() -> None:
    assert check_file(DEPLOY / "controller.yaml", env={}).startswith("controller: grpc 127.0.0.1:50051")
    assert check_file(DEPLOY / "agent.yaml", env={}).startswith("agent gpu-node-001 (compute, nvml)")


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def test_config_check_subprocess(tmp_path: Path) -> None:
    for name, kind in (("controller.yaml", "controller"), ("agent.yaml", "agent")):
        done = _run_cli("config", "check", str(DEPLOY / name), "--kind", kind)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"ok: {kind}") and len(done.stdout.splitlines()) == 1
    bad = write(tmp_path, {"ingest": {"heartbeat_timeout_s": "soon"}, "server": {"lisen": "x:1"}})
    done = _run_cli("config", "check", str(bad))
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f"{bad}: server.lisen: unknown key, did you mean 'listen'?",
        f"{bad}: ingest.heartbeat_timeout_s: must be a number > 0, got 'soon'",
    ]
    done = _run_cli("config", "check", str(DEPLOY / "controller.yaml"), "--kind", "agent")
    assert done.returncode == 2 and "agent.node_id: is required" in done.stdout


def test_controller_runs_with_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`starpulse controller --config FILE` serves with the file's settings."""
    from controller.service import Controller

    db = tmp_path / "ctl.db"
    path = write(
        tmp_path,
        {
            "server": {"listen": "127.0.0.1:0", "http": "127.0.0.1:0", "db_path": str(db)},
            "ingest": {"heartbeat_timeout_s": 42},
            "log": {"level": "warning"},
        },
    )
    seen: dict[str, Any] = {}

    async def serve(self: Controller, stop: asyncio.Event) -> None:
        await self.start()
        seen["config"], seen["port"] = self.config, self.grpc_port
        await self.stop()

    monkeypatch.setattr(Controller, "serve_forever", serve)
    monkeypatch.setenv("STARPULSE_INGEST__RATE_BURST", "77")
    assert cli.main(["controller", "--config", str(path), "--http", "127.0.0.1:0"]) == 0
    cfg = seen["config"]
    assert cfg.heartbeat_timeout_s == 42.0 and cfg.db_path == db and cfg.rate_burst == 77.0
    assert seen["port"] > 0 and db.exists()


def test_controller_config_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {"ingest": {"heartbeat_timeout_s": "soon"}})
    assert cli.main(["controller", "--config", str(path)]) == 2
    assert f"starpulse controller: {path}: ingest.heartbeat_timeout_s: must be" in capsys.readouterr().err


def test_agent_runs_with_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        {
            "agent": {
                "node_id": "node-007",
                "controllers": ["127.0.0.1:1"],
                "interval_s": 3,
                "state_dir": str(tmp_path / "state"),
            },
            "hardware": {"backend": "sim", "ethtool": False},
        },
        "agent.yaml",
    )
    seen: list[Any] = []

    async def run(agent: Any) -> None:
        seen.append(agent)

    monkeypatch.setattr(cli.services, "_run_agent", run)
    assert cli.main(["agent", "--config", str(path), "--interval-s", "4"]) == 0
    (agent,) = seen
    assert agent.config.node_id == "node-007" and agent.config.interval_s == 4.0
    assert agent.config.buffer_path == str(tmp_path / "state" / "agent-buffer.db")


def test_agent_without_node_id_or_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["agent", "--controller", "x:1"]) == 2
    assert "--node-id is required" in capsys.readouterr().err


def test_tls_and_auth_sections_build_the_service_settings(tmp_path: Path) -> None:
    token = tmp_path / "admin.tokens"
    token.write_text("# ops\n" + "t" * 40 + "\n")
    for name in ("ca.pem", "c.pem", "c.key"):  # the settings check the files exist (their contents load at start)
        (tmp_path / name).write_text("pem\n")
    path = write(
        tmp_path,
        {
            "tls": {"ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "c.key"},
            "auth": {"admin_token_file": "admin.tokens", "open_reads": False},
        },
    )
    settings = load_controller_settings(path, {})
    assert settings.tls is not None and settings.tls.ca_file == tmp_path / "ca.pem"
    assert settings.controller.tls == settings.tls
    assert settings.controller.auth.admin_tokens == ["t" * 40] and settings.controller.auth.open_reads is False
    token.write_text("short\n")
    (err,) = errors_of(load_controller_settings, path, {})
    assert err.startswith(f"{path}: auth: ")


def test_agent_lldp_socket_and_sim_shape(tmp_path: Path) -> None:
    hw = {
        "backend": "sim",
        "lldpcli_socket": "lldpd.sock",
        "lldp_interval_s": 2,
        "sim_gpus": 2,
        "sim_nics": 2,
        "sim_real_netdevs": True,
    }
    path = write(tmp_path, {**AGENT_MIN, "hardware": hw}, "agent.yaml")
    _, opt = load_agent_config(path, {})
    assert opt.lldpcli_socket == str(tmp_path / "lldpd.sock")  # relative to the file
    assert (opt.lldp_interval_s, opt.sim_gpus, opt.sim_nics, opt.sim_real_netdevs) == (2.0, 2, 2, True)
    argv = ["agent", "--config", str(path), "--sim-nics", "4", "--lldpcli-socket", "/run/l.sock"]
    args = cli.build_parser().parse_args(argv)
    args.argv = argv
    _, opt = load_agent_config(path, {}, cli.overrides(args))
    assert opt.sim_nics == 4 and opt.lldpcli_socket == "/run/l.sock"
    bad = write(tmp_path, {**AGENT_MIN, "hardware": {"sim_nics": 29}}, "bad.yaml")
    expected = f"{bad}: hardware.sim_nics: must be an integer >= 0 and <= 28, got 29"
    assert errors_of(load_agent_config, bad, {}) == [expected]


def test_the_probe_mesh_section_reaches_detection_and_bad_values_name_their_key(tmp_path: Path) -> None:
    path = write(
        tmp_path, {"detection": {"probes": {"enabled": True, "where": "idle_only", "packets_per_s_per_nic": 5}}}
    )
    cfg = load_controller_config(path, {})
    probes = cfg.detection.probes
    assert (probes.enabled, probes.where, probes.packets_per_s_per_nic) == (True, "idle_only", 5.0)
    bad = write(tmp_path, {"detection": {"probes": {"where": "sometimes", "dscp": 99}}}, "bad.yaml")
    errors = errors_of(load_controller_settings, bad, {})
    assert len(errors) == 2
    assert any("detection.probes.where" in e and "sometimes" in e for e in errors)
    assert any("detection.probes.dscp" in e for e in errors)
