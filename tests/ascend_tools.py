"""A folder of fake Ascend tools (``tests/fakes/npu-smi``, ``tests/fakes/hccn_tool``) and their answers.

The fakes are shell scripts on PATH that print files from a state folder, so a real agent
process (or the real ``run_tool``) runs them as it would the real tools. The answers start
as the fixtures of ``tests/fixtures/ascend/`` with each NPU's own LLDP peer, link and
counters; a test changes them with ``set_link``/``set_peer``/``set_counters``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.sim.fake_npu_smi import FakeNpuSmi

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "fakes"
FIXTURES = ROOT / "tests" / "fixtures" / "ascend"
HCCN = FIXTURES / "hccn_tool"


def lldp_text(system_name: str, port: str, mac: str = "70:c7:f2:5a:1b:03") -> str:
    """The lldpad layout of the recorded ``-lldp -g`` with another peer."""
    text = (HCCN / "lldp.txt").read_text()
    text = text.replace("LEAF-B0-R3", system_name).replace("400GE1/1/20:2", port)
    return text.replace("70:c7:f2:5a:1b:03", mac)


def link_stat_text(device: int, ups: int, downs: int) -> str:
    lines = [
        f"[devid {device}]current time        : Tue Oct 28 21:46:46 2025",
        f"[devid {device}]link up count       : {ups}",
        f"[devid {device}]link down count     : {downs}",
        f"[devid {device}]link change records :",
    ]
    return "\n".join(lines) + "\n"


class AscendTools:
    """The state folder behind the fakes for one node of ``npus`` NPUs, port d on (leaf-b0-r<d>, Ethernet0)."""

    def __init__(self, root: Path, npus: int = 8, slot_port: str = "Ethernet0") -> None:
        self.root = root
        self.hccn_dir = root / "hccn"
        self.npu_dir = root / "npu-smi"
        self.npus = npus
        self.npu_smi = FakeNpuSmi(npu_count=npus)
        for d in range(npus):
            (self.hccn_dir / str(d)).mkdir(parents=True, exist_ok=True)
        self.npu_dir.mkdir(parents=True, exist_ok=True)
        for name in ("speed", "stat", "optical", "net_health", "ip"):
            src = {"net_health": "net_health.success", "optical": "optical"}.get(name, name)
            self._write(self.hccn_dir / f"{name}.txt", (HCCN / f"{src}.txt").read_text())
        for d in range(npus):
            self.set_link(d, True)
            self.set_peer(d, f"leaf-b0-r{d}", slot_port)
            self._write(self.hccn_dir / str(d) / "link_stat.txt", link_stat_text(d, 1, 0))
        self.render_npu_smi()

    @staticmethod
    def _write(path: Path, text: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # a reader never sees half a file

    def render_npu_smi(self) -> None:
        self._write(self.npu_dir / "info.txt", self.npu_smi.render_info())
        for n in self.npu_smi.npus:
            self._write(self.npu_dir / f"health.{n.npu_id}.txt", self.npu_smi.render_health(n.npu_id))
            self._write(self.npu_dir / f"hccs.{n.npu_id}.txt", self.npu_smi.render_hccs(n.npu_id))

    def set_link(self, device: int, up: bool) -> None:
        self._write(self.hccn_dir / str(device) / "link.txt", f"link status: {'UP' if up else 'DOWN'}\n")

    def set_peer(self, device: int, system_name: str, port: str) -> None:
        self._write(self.hccn_dir / str(device) / "lldp.txt", lldp_text(system_name, port))

    def set_link_stat(self, device: int, ups: int, downs: int) -> None:
        self._write(self.hccn_dir / str(device) / "link_stat.txt", link_stat_text(device, ups, downs))

    def set_file(self, device: int | None, what: str, text: str) -> None:
        folder = self.hccn_dir if device is None else self.hccn_dir / str(device)
        self._write(folder / f"{what}.txt", text)

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose PATH finds the fakes first and that points them at this folder."""
        path = os.pathsep.join([str(FAKES), os.environ.get("PATH", "")])
        return {
            **os.environ,
            "PATH": path,
            "FAKE_HCCN_DIR": str(self.hccn_dir),
            "FAKE_NPU_SMI_DIR": str(self.npu_dir),
            **extra,
        }
