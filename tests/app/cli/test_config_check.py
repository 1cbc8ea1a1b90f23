"""`starpulse config check` reports the settings' errors and the files they name in one run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from starpulse.app import cli


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main() points logging at the (captured, later closed) stderr; keep the test's config."""
    monkeypatch.setattr("starpulse.core.logs.configure_logging", lambda *a, **k: None)


def test_settings_errors_and_missing_files_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rules.yaml").write_text("rules: [ {not: valid\n")
    path = tmp_path / "controller.yaml"
    settings = {
        "ingest": {"heartbeat_timeout_s": "soon"},
        "fabric": {"path": "missing-fabric.json"},
        "detection": {"rules_path": "rules.yaml"},
    }
    path.write_text(yaml.safe_dump(settings))
    assert cli.main(["config", "check", str(path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert any("ingest.heartbeat_timeout_s" in line for line in lines), lines  # the setting's error ...
    assert any("fabric.path" in line and "missing-fabric.json" in line for line in lines), lines  # ... and the files
    assert any("detection.rules_path" in line for line in lines), lines
    assert all(line.startswith(f"{path}: ") for line in lines), lines


def test_a_wrong_path_setting_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({"fabric": {"path": 5}, "ingest": {"heartbeat_timeout_s": -1}}))
    assert cli.main(["config", "check", str(path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if "fabric.path" in line]) <= 1, lines
    assert any("heartbeat_timeout_s" in line for line in lines), lines
