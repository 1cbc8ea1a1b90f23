"""The layer contract in pyproject.toml holds, and it bites: an upward import breaks it.

The contract is checked on a copy of the tree, so the bad imports below never touch the
checkout; PYTHONPATH puts the copy ahead of the installed (editable) packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "controller", "relay", "starpulse")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[dev]')"
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def add_import(tree: Path, module: str, statement: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{statement}\n")


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "statement", "contract"),
    [
        ("starpulse.core.findings", "import starpulse.app.cli", "Floors"),  # the shared core reaching up
        ("agent.runtime", "import controller.store", "Floors"),  # one program importing another
        ("relay.upstream", "import agent.transport.link", "Floors"),
        ("controller.ingest.registry", "import controller.detect.shard_worker", "Controller floors"),
        ("controller.detect.rules", "import controller.heal.policy", "Controller floors"),  # detect -> heal
        ("controller.outputs.admin", "import controller.service", "Controller floors"),  # the old circle
        ("controller.detect.evaluators.gpu", "import controller.detect.conditions", "Evaluators below the engine"),
        ("controller.detect.evaluators.nic", "import controller.detect.lifecycle", "Evaluators below the engine"),
        ("controller.detect.intake", "import controller.detect.evaluators.events", "The engine names no rule kind"),
        ("controller.detect.reports", "import controller.detect.evaluators.gpu", "The engine names no rule kind"),
        ("agent.collectors.gpu", "import agent.runtime", "Agent floors"),
        ("agent.factory", "import agent.sim.node", "Simulator off the production path"),  # the old import
        ("controller.outputs.web.api", "import controller.detect.pipeline", "Outputs read the query surface"),
        ("controller.ha.standby", "import controller.detect.incidents", "Outputs read the query surface"),
        ("controller.query.store", "import controller.outputs.query", "Controller floors"),  # query below outputs
        ("starpulse.job", "import starpulse.core.tls", "Job library"),
    ],
)
def test_an_upward_import_breaks_the_contract(tree: Path, module: str, statement: str, contract: str) -> None:
    add_import(tree, module, statement)
    result = lint(tree)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), result.stdout
    assert module in result.stdout
