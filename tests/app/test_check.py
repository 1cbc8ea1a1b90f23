"""`starpulse check FILE...`: every data file kind, found by its keys, every error a line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from controller.fabric import generate_fabric
from controller.fabric.io import save_fabric
from starpulse.app.check import detect_kind

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [
    ROOT / "deploy" / "controller.yaml",
    ROOT / "deploy" / "agent.yaml",
    ROOT / "deploy" / "relay.yaml",
    ROOT / "controller" / "detect" / "default_rules.yaml",
    ROOT / "controller" / "heal" / "default_policy.yaml",
    *sorted((ROOT / "tests" / "scenarios").glob("*.yaml")),
]


def check(*args: str) -> tuple[int, list[str]]:
    """`starpulse check ARGS` as a user runs it: its exit code and its output lines (stdout)."""
    done = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


def test_every_shipped_file_passes() -> None:
    code, lines = check(*map(str, SHIPPED))
    assert code == 0, lines
    assert len(lines) == len(SHIPPED) and all(line.startswith("ok: ") for line in lines), lines
    kinds = [line.split(" (")[1].split(")")[0] for line in lines]
    assert kinds[:5] == ["controller", "agent", "relay", "rules", "policy"]
    assert set(kinds[5:]) == {"scenario"}


def write(tmp_path: Path, name: str, data: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_each_kind_reports_every_error_with_file_and_key(tmp_path: Path) -> None:
    """One run over a bad file of each kind: every problem of each, by file and key, and exit 2."""
    policy = write(
        tmp_path,
        "policy.yaml",
        {
            "version": 1,
            "kinds": {"gpu_fault": {"action": "rset", "min_severity": "loud"}, "partition": {"action": "evict"}},
            "escalation": {"max_repair_loops": 0},
        },
    )
    notify = write(tmp_path, "notify.yaml", {"receivers": [{"name": "a", "type": "slack", "url": "ftp://x"}]})
    scenario = write(
        tmp_path, "s.yaml", {"name": "s", "fabric": {"nodes": 0}, "duration_s": -1, "faults": [{"at_s": 1}]}
    )
    fabric_path = tmp_path / "fabric.json"
    save_fabric(generate_fabric(2, nodes_per_block=2, spines=1), fabric_path)
    good = str(fabric_path)
    code, out = check(str(policy), str(notify), str(scenario), good)
    assert code == 2
    assert out == [
        f"{policy}: kinds.gpu_fault.action: must be one of alert_only, cordon, evict, reset_gpu, reboot, rma, "
        "got 'rset'",
        f"{policy}: kinds.gpu_fault.min_severity: must be one of info, warning, critical, fatal, got 'loud'",
        f"{policy}: kinds.partition: partition may only be alert_only (the node is not the culprit), got evict",
        f"{policy}: escalation.max_repair_loops: must be an integer >= 1, got 0",
        f"{notify}: receivers[0].type: must be one of alertmanager_webhook, alertmanager_api, webhook, got 'slack'",
        f"{notify}: receivers[0].url: must be a string starting with http:// or https://, got 'ftp://x'",
        f"{scenario}: fabric.nodes: must be an integer >= 1, got 0",
        f"{scenario}: duration_s: must be a number > 0, got -1",
        f"ok: {good} (fabric): " + out[-1].split("(fabric): ")[1],
    ]


def test_kind_by_keys_and_by_flag(tmp_path: Path) -> None:
    assert detect_kind("x.yaml", {"version": 1, "kinds": {}}) == "policy"
    assert detect_kind("x.yaml", {"version": 1, "rules": []}) == "rules"
    assert detect_kind("x.yaml", {"version": 1, "vertices": []}) == "fabric"
    assert detect_kind("x.yaml", {"name": "s", "fabric": {"nodes": 2}}) == "scenario"
    assert detect_kind("x.yaml", {"receivers": []}) == "notify"
    assert detect_kind("x.yaml", {"ingest": {}}) == "controller"
    assert detect_kind("x.yaml", {"agent": {}}) == "agent"
    path = write(tmp_path, "x.yaml", {"receivers": []})
    assert check("--kind", "policy", str(path)) == (
        2,
        [f"{path}: receivers: unknown key", f"{path}: version: is required", f"{path}: kinds: is required"],
    )


def test_unreadable_and_malformed_files_are_one_line_each_never_a_traceback(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("kinds: [\n")
    listed = write(tmp_path, "list.yaml", ["a", "b"])
    missing = tmp_path / "missing.yaml"
    code, lines = check(str(bad_yaml), str(listed), str(missing), str(tmp_path))
    assert code == 2
    assert [line.split(": ")[0] for line in lines] == [str(bad_yaml), str(listed), str(missing), str(tmp_path)]
    assert "not valid YAML" in lines[0] and "must be a mapping" in lines[1] and "cannot read" in lines[2]


def test_a_controller_file_reports_every_notify_error_under_notify(tmp_path: Path) -> None:
    path = write(tmp_path, "controller.yaml", {"notify": {"batch_size": 0, "receivers": [{"name": "a", "type": "x"}]}})
    code, lines = check(str(path))
    assert code == 2
    assert lines == [
        f"{path}: notify.receivers[0].type: must be one of alertmanager_webhook, alertmanager_api, webhook, got 'x'",
        f"{path}: notify.receivers[0].url: is required",
        f"{path}: notify.batch_size: must be an integer >= 1, got 0",
    ]
