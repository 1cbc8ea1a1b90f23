"""Never healthy for what was not read (issue 30 item 3), through the real `starpulse scan`.

For each backend, the tool missing, failing, printing what cannot be parsed, or answering for
no accelerator makes the verdict "could not check" (exit 2) with one line naming the tool and
what it said; an expected inventory of zero is the one exception. The fakes sit at the
hardware edge only: a fake ``npu-smi`` executable on PATH, and fake ``pynvml``/``amdsmi``
modules with the real names found first on PYTHONPATH (tests/fakes/).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.sim.fake_npu_smi import FakeNpuSmi
from tests.support.scan import STARPULSE

ROOT = Path(__file__).resolve().parents[3]
FAKES = ROOT / "tests" / "fakes"
MODULES = FAKES / "modules"


def _scan(tmp_path: Path, backend: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """One scan with no NIC tree (an empty sysfs root) so only the accelerators decide."""
    root = tmp_path / "sys"
    root.mkdir(exist_ok=True)
    args = [*STARPULSE, "scan", "--backend", backend, "--window", "0.1", "--sysfs-root", str(root), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env, check=False)


def _module_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(MODULES), str(ROOT)]), **extra}


def _npu_env(tmp_path: Path, info: str | None, with_tool: bool = True) -> dict[str, str]:
    """PATH with the fake npu-smi printing ``info`` (None: no info file, so the tool fails)."""
    folder = tmp_path / "npu-smi"
    folder.mkdir(exist_ok=True)
    if info is not None:
        (folder / "info.txt").write_text(info)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if with_tool:
        target = bin_dir / "npu-smi"
        if not target.exists():
            target.symlink_to(FAKES / "npu-smi")
    # No other folder on PATH: no real npu-smi or hccn_tool can answer in the fakes' place.
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "FAKE_NPU_SMI_DIR": str(folder)}


def _no_npu_table() -> str:
    """npu-smi's frame with the NPU rows taken out: the tool answers, for no chip."""
    lines = FakeNpuSmi(npu_count=1).render_info().splitlines()
    return "\n".join(lines[:6] + lines[8:]) + "\n"


def _could_not_check(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """The one "could not check" line of a scan (stdout or stderr), checked for ``words``; exit 2."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "could not check:" in line]
    assert len(lines) == 1, proc.stdout + proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


class TestAscend:
    def test_missing_tool(self, tmp_path: Path) -> None:
        """No npu-smi on PATH: one line naming it, exit 2."""
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, None, with_tool=False))
        _could_not_check(proc, "npu-smi", "not on PATH")

    def test_failing_tool(self, tmp_path: Path) -> None:
        """npu-smi exits non-zero: the line carries its exit status and what it printed on stderr."""
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, None))
        _could_not_check(proc, "npu-smi info: exit 1", "info.txt")

    def test_unparseable_output(self, tmp_path: Path) -> None:
        """A table this parser cannot read is never "no NPU, healthy": it is quoted back."""
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, "dcmi module initialize failed. ret is -8005\n"))
        _could_not_check(proc, "npu-smi", "dcmi module initialize failed. ret is -8005")

    def test_zero_devices(self, tmp_path: Path) -> None:
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, _no_npu_table()))
        _could_not_check(proc, "npu-smi", "npu-smi 24.1.rc3")

    def test_zero_devices_expected_zero_is_judged(self, tmp_path: Path) -> None:
        """An expected inventory of zero accelerators is the one exception."""
        expect = tmp_path / "expect.yaml"
        expect.write_text("gpus: 0\n")
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, _no_npu_table()), "--expect", str(expect), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        check = json.loads(proc.stdout)["sample"]["accelerator_check"]
        assert check["judged"] is True and check["expected"] == 0, check

    def test_fewer_than_expected_while_the_tool_answers(self, tmp_path: Path) -> None:
        """Seven NPUs where eight are expected: the tool answers, and the node is not healthy."""
        info = FakeNpuSmi(npu_count=7).render_info()
        expect = tmp_path / "expect.yaml"
        expect.write_text("gpus: 8\n")
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, info), "--expect", str(expect), "--json")
        data = json.loads(proc.stdout)
        assert proc.returncode != 0 and data["verdict"]["status"] != "healthy", data["verdict"]
        assert "npu-smi found 7 ascend accelerators, expected 8" in data["verdict"]["problems"][0]

    def test_the_agents_learned_inventory_holds_the_scan_too(self, tmp_path: Path) -> None:
        """No --expect: the agent's confirmed count (its state folder's accelerators.json) still catches a lost NPU."""
        learned = tmp_path / "accelerators.json"
        learned.write_text('{"count": 8, "vendor": "ascend", "confirmed": true}\n')
        info = FakeNpuSmi(npu_count=7).render_info()
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, info), "--learned", str(learned))
        _could_not_check(proc, "npu-smi found 7 ascend accelerators, expected 8 (learned, confirmed)")

    def test_all_read_is_judged(self, tmp_path: Path) -> None:
        proc = _scan(tmp_path, "ascend", _npu_env(tmp_path, FakeNpuSmi(npu_count=2).render_info()), "--json")
        check = json.loads(proc.stdout)["sample"]["accelerator_check"]
        assert (check["judged"], check["found"], check["tool"]) == (True, 2, "npu-smi"), check


@pytest.mark.parametrize(
    ("backend", "tool", "vendor", "driver_env"),
    [("nvml", "NVML", "nvidia", "FAKE_NVML_DRIVER"), ("amd", "amdsmi", "amd", "FAKE_AMD_DRIVER")],
)
class TestLibraryBackends:
    def test_missing_driver(self, tmp_path: Path, backend: str, tool: str, vendor: str, driver_env: str) -> None:
        """The library cannot reach its driver: one line on stderr naming it, exit 2."""
        proc = _scan(tmp_path, backend, _module_env(**{driver_env: "missing"}))
        line = _could_not_check(proc, f"backend {backend} unavailable", {"amdsmi": "AMD SMI"}.get(tool, tool))
        assert proc.stderr.strip() == line

    def test_zero_devices(self, tmp_path: Path, backend: str, tool: str, vendor: str, driver_env: str) -> None:
        """The library answers for no device: could not check, never healthy."""
        proc = _scan(tmp_path, backend, _module_env(FAKE_GPUS="0"))
        _could_not_check(proc, f"{tool} answered but found no {vendor} accelerator")

    def test_zero_devices_expected_zero(
        self, tmp_path: Path, backend: str, tool: str, vendor: str, driver_env: str
    ) -> None:
        expect = tmp_path / "expect.yaml"
        expect.write_text("gpus: 0\n")
        proc = _scan(tmp_path, backend, _module_env(FAKE_GPUS="0"), "--expect", str(expect))
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_devices_read(self, tmp_path: Path, backend: str, tool: str, vendor: str, driver_env: str) -> None:
        proc = _scan(tmp_path, backend, _module_env(FAKE_GPUS="2"), "--json")
        check = json.loads(proc.stdout)["sample"]["accelerator_check"]
        assert (check["judged"], check["found"], check["tool"], check["vendor"]) == (True, 2, tool, vendor)
