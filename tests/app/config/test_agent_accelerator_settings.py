"""The agent's expected accelerator inventory from its settings (issue 30): a count, or learning."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent.collectors.accel.check import LEARNED_FILE, Expected
from starpulse.app.cli.services import _accelerator_expectation
from starpulse.app.config.agent import load_agent_config


def _options(tmp_path: Path, accelerators: dict[str, object] | None) -> object:
    body: dict[str, object] = {
        "agent": {"node_id": "n1", "controllers": ["127.0.0.1:1"], "state_dir": str(tmp_path)},
    }
    if accelerators is not None:
        body["accelerators"] = accelerators
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(body))
    return load_agent_config(path, env={})[1]


def test_a_count_in_the_settings_is_the_expectation(tmp_path: Path) -> None:
    opt = _options(tmp_path, {"expected_count": 8, "expected_vendor": "ascend"})
    assert _accelerator_expectation(opt) == {"expected": Expected(8, "ascend")}


def test_without_a_count_the_agent_learns_into_its_state_folder(tmp_path: Path) -> None:
    assert _accelerator_expectation(_options(tmp_path, None)) == {"learned_path": str(tmp_path / LEARNED_FILE)}


def test_learning_can_be_turned_off(tmp_path: Path) -> None:
    assert _accelerator_expectation(_options(tmp_path, {"learn": False})) == {}
