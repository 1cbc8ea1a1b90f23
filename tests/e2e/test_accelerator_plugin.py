"""The plugin slot end to end: examples/acme-accelerator pip-installed, discovered, reporting
through a real agent process to a real controller; its fault detected and healed like any other.

The package is installed with pip into a folder of this test (``--target``), never into the
shared environment, and the agent process gets that folder on its path. A second, broken
plugin beside it shows a plugin that fails to import is refused in one line and takes
nothing else down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.clock import SYSTEM_CLOCK
from tests.e2e.agent_process import agent_process
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "acme-accelerator"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the Acme plugin pip-installed into it, and a broken plugin's metadata."""
    target = tmp_path_factory.mktemp("plugins")
    build = tmp_path_factory.mktemp("build")
    source = build / "acme-accelerator"  # a copy: setuptools writes build/ and egg-info beside the source
    shutil.copytree(EXAMPLE, source)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"),
            *("--target", str(target), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TMPDIR": str(build)},
    )
    assert proc.returncode == 0, proc.stderr
    assert (target / "acme_accelerator" / "backend.py").is_file()
    broken = target / "acme_broken-0.1.dist-info"
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-broken\nVersion: 0.1\n")
    (broken / "entry_points.txt").write_text("[starpulse.accelerators]\nacme-broken = acme_no_such_module:make\n")
    return target


def starpulse(plugins: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "starpulse.app.cli", *args]


def plugin_env(plugins: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(plugins), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def run(plugins: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        starpulse(plugins, *args),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=plugin_env(plugins, **extra),
    )


def write_state(path: Path, faults: list[str] | None = None) -> None:
    chips = [{"temperature_c": 50 + i, "uncorrectable": 0, "faults": []} for i in range(4)]
    chips[2]["faults"] = faults or []
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"chips": chips}))
    tmp.replace(path)


class TestDiscovery:
    def test_scan_lists_and_runs_the_plugin(self, plugins: Path, tmp_path: Path) -> None:
        """`scan --backend acme` is a choice once the package is installed; its chips name their vendor."""
        state = tmp_path / "acme.json"
        write_state(state, ["E42"])
        out = run(plugins, "scan", "--backend", "acme", "--json", ACME_STATE=str(state))
        assert out.returncode == 1, out.stderr  # a critical finding
        data = json.loads(out.stdout)
        assert {g["vendor"] for g in data["inventory"]["gpus"]} == {"acme"}
        (finding,) = [f for f in data["findings"] if f["kind"] == "accel_fault"]
        assert (finding["component"], finding["vendor_code"], finding["action"]) == ("gpu-2", "E42", "reset_gpu")

    def test_a_broken_plugin_is_one_line_and_isolated(self, plugins: Path) -> None:
        """The broken plugin fails alone, in one line naming it; every other backend still runs."""
        out = run(plugins, "scan", "--backend", "acme-broken")
        assert out.returncode == 2
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "acme-broken" in lines[0] and "failed to load" in lines[0], out.stderr
        ok = run(plugins, "scan", "--backend", "sim", "--json")
        assert ok.returncode in (0, 1) and json.loads(ok.stdout)["inventory"]["gpus"], ok.stderr

    def test_plugin_without_its_driver_is_one_line(self, plugins: Path) -> None:
        out = run(plugins, "scan", "--backend", "acme")
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [
            "starpulse scan: backend acme unavailable: ACME_STATE is not set (the Acme driver's state file)"
        ]


class TestThroughAgentAndController:
    async def test_plugin_fault_is_detected_and_healed(self, plugins: Path, tmp_path: Path) -> None:
        """A real agent process on the Acme backend; E42 on chip 2 -> gpu_fault incident -> the node drained."""
        fabric = generate_fabric(2, 4, 4, 2, 1)
        sched = SimScheduler(fabric.nodes())
        ctl = Controller(
            ControllerConfig(
                listen="127.0.0.1:0",
                http="127.0.0.1:0",
                db_path=tmp_path / "c.db",
                fabric=fabric,
                sweep_interval_s=0.2,
                heal=HealSettings(scheduler=sched, guards=GuardConfig(mode="enforce")),
            ),
            clock=SYSTEM_CLOCK,
        )
        ctl.detection.correlator.config.settle_s = 0.5
        await ctl.start()
        state = tmp_path / "acme.json"
        write_state(state)
        env = plugin_env(plugins, ACME_STATE=str(state))
        try:
            async with agent_process(ctl, tmp_path, "acme", env, "the Acme node registered with a report"):
                inv = ctl.registry.nodes["node-001"].inventory
                assert [g.vendor for g in inv.gpus] == ["acme"] * 4
                write_state(state, ["E42"])
                await wait_for(
                    lambda: bool(ctl.detection.incidents.list_incidents(active_only=True)), 30, "the incident"
                )
                (incident,) = ctl.detection.incidents.list_incidents(active_only=True)
                assert (incident.kind, incident.root_cause, incident.action) == (
                    "gpu_fault",
                    "node-001/gpu-2",
                    "reset_gpu",
                )
                await wait_for(lambda: any(a[:2] == ("drain", "node-001") for a in sched.actions), 30, "the drain")
        finally:
            await ctl.stop()
