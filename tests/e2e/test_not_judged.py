"""Never healthy for what was not read (issue 30 item 3), end to end: a real agent process on a
fake tool at the hardware edge (npu-smi on PATH, pynvml by its real name on PYTHONPATH) streams
to a real controller over loopback gRPC, which shows the node "not judged" on its query surface
and its metric, keeps the accel_check events, and never offers the node as a spare."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.sim.fake_npu_smi import FakeNpuSmi
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import telemetry_pb2 as tpb
from tests.ascend_tools import FAKES
from tests.e2e.agent_process import agent_process
from tests.helpers import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NODE = "node-001"


def _controller(tmp_path: Path) -> Controller:
    fabric = generate_fabric(4, 8, 8, 2, 1)
    return Controller(
        ControllerConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            fabric=fabric,
            sweep_interval_s=0.2,
            heal=HealSettings(scheduler=SimScheduler(fabric.nodes()), guards=GuardConfig(mode="enforce")),
        ),
        clock=SYSTEM_CLOCK,
    )


def _npu_env(tmp_path: Path, info: str | None, with_tool: bool = True) -> dict[str, str]:
    folder = tmp_path / "npu-smi"
    folder.mkdir(exist_ok=True)
    if info is not None:
        _write(folder / "info.txt", info)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if with_tool:
        (bin_dir / "npu-smi").symlink_to(FAKES / "npu-smi")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "FAKE_NPU_SMI_DIR": str(folder)}


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _status(ctl: Controller) -> tuple[bool, str]:
    (row,) = [n for n in ctl.queries.node_statuses() if n.node_id == NODE]
    return row.judged, row.not_judged_why


def _not_judged_gauge(ctl: Controller) -> float | None:
    return ctl.metrics.registry.get_sample_value("starpulse_nodes_not_judged")


async def test_unparseable_npu_smi_then_read_then_a_chip_lost(tmp_path: Path) -> None:
    """Not judged while npu-smi prints what cannot be read (never a spare); judged once it prints
    the table and the agent restarts (eight NPUs learned at that first sight); not judged again when one NPU is gone
    although npu-smi still answers."""
    ctl = _controller(tmp_path)
    await ctl.start()
    folder = tmp_path / "npu-smi"
    env = _npu_env(tmp_path, "dcmi module initialize failed. ret is -8005\n")
    assert ctl.healer is not None and ctl.healer.spares is not None
    spares = ctl.healer.spares
    spares.mark_spare(NODE)
    try:
        async with agent_process(ctl, tmp_path, "ascend", env, "the Ascend node registered with a report"):
            judged, why = _status(ctl)
            assert not judged and why.startswith("npu-smi") and "dcmi module initialize failed" in why, why
            assert _not_judged_gauge(ctl) == 1.0
            assert not spares.is_available(NODE) and spares.choose("node-002") is None

        # A backend unsupported at start is read again when the agent restarts (systemd's Restart=).
        _write(folder / "info.txt", FakeNpuSmi(npu_count=8).render_info())
        async with agent_process(ctl, tmp_path, "ascend", env, "the restarted agent's first report"):
            await wait_for(lambda: _status(ctl)[0], 30, "judged once npu-smi prints its table")
            assert _not_judged_gauge(ctl) == 0.0
            assert spares.is_available(NODE)

            _write(folder / "info.txt", FakeNpuSmi(npu_count=7).render_info())
            await wait_for(lambda: not _status(ctl)[0], 30, "not judged with one NPU gone")
            assert "npu-smi found 7 ascend accelerators, expected 8 (learned)" in _status(ctl)[1]
            stored = ctl.store.latest_events_of_kind(tpb.EVENT_KIND_ACCEL_CHECK)[NODE]
            assert stored.attributes["judged"] == "false" and "expected 8" in stored.message
    finally:
        await ctl.stop()
    learned = (tmp_path / "agent" / "accelerators.json").read_text()
    assert '"count": 8' in learned and '"confirmed": false' in learned


async def test_agent_without_npu_smi_runs_on_and_reports_not_judged(tmp_path: Path) -> None:
    """The tool missing: the agent does not exit; the controller hears it and shows why."""
    ctl = _controller(tmp_path)
    await ctl.start()
    try:
        async with agent_process(ctl, tmp_path, "ascend", _npu_env(tmp_path, None, with_tool=False), "registered"):
            judged, why = _status(ctl)
            assert not judged and "npu-smi is not on PATH" in why, why
    finally:
        await ctl.stop()


async def test_npu_smi_failing_is_not_judged(tmp_path: Path) -> None:
    """npu-smi exits non-zero (no table file for the fake): its exit status and words reach the controller."""
    ctl = _controller(tmp_path)
    await ctl.start()
    try:
        async with agent_process(ctl, tmp_path, "ascend", _npu_env(tmp_path, None), "registered"):
            judged, why = _status(ctl)
            assert not judged and "npu-smi info: exit 1" in why, why
    finally:
        await ctl.stop()


@pytest.mark.parametrize(("backend", "said"), [("nvml", "NVML"), ("amd", "amdsmi")])
async def test_a_library_with_no_gpu_is_not_judged(tmp_path: Path, backend: str, said: str) -> None:
    """NVIDIA's and AMD's backends under the same rule: the library answers for no GPU."""
    ctl = _controller(tmp_path)
    await ctl.start()
    modules = ROOT / "tests" / "fakes" / "modules"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(modules), str(ROOT)]), "FAKE_GPUS": "0"}
    vendor = {"nvml": "nvidia", "amd": "amd"}[backend]
    try:
        async with agent_process(ctl, tmp_path, backend, env, "registered"):
            judged, why = _status(ctl)
            assert not judged and why == f"{said} answered but found no {vendor} accelerator", why
    finally:
        await ctl.stop()
