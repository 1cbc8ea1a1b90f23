"""Huawei Ascend NPUs through the tools an Ascend node has: ``npu-smi``.

``run`` is the seam: it takes an argv and returns the tool's stdout (``run_tool`` on a real
node, ``agent.sim.fake_npu_smi.FakeNpuSmi`` in tests and the simulator, which renders the same
text). Every cycle reads ``npu-smi info`` (one call for all chips); a chip whose health is not
OK is asked ``npu-smi info -t health -i N -c C`` for its DCMI error codes, and each new code is
one ``accel_fault`` finding with the action its MindCluster level maps to
(``ascend_faults``). Each chip's HCCS links (``npu-smi info -t hccs``) fill the same
interconnect-link fields as AMD's XGMI (``links``, ``links_down``, ``link_count``), so the
rule gpu.link_down judges them; a chip whose npu-smi has no HCCS query is not asked again.
With ``hccn`` (a runner for ``hccn_tool``) the backend also has
``nic_ports``, the collector of the NPUs' own RoCE ports (``accel.hccn``), which the factory
runs after the host's LLDP collector.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import structlog

from agent.collectors.accel import ascend_faults as faults
from agent.collectors.accel.ascend_parse import HccsStatus, NpuChip, parse_hccs, parse_npu_health, parse_npu_smi_info
from agent.collectors.accel.base import BackendUnavailable
from agent.collectors.accel.check import one_line
from agent.collectors.accel.hccn import TOOL as HCCN_TOOL
from agent.collectors.accel.hccn import HccnPortCollector, find_hccn_tool
from agent.collectors.accel.watch import DeviceWatch
from agent.collectors.base import CollectorUnsupported, FindingSink
from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

VENDOR = "ascend"
SOURCE = "npu-smi"
Run = Callable[[list[str]], str]
_TIMEOUT_S = 10.0


def run_tool(argv: list[str]) -> str:
    """A real tool's stdout; CollectorUnsupported when it fails (the runner records it per cycle)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CollectorUnsupported(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise CollectorUnsupported(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def load_npu_smi() -> Run:
    """The real npu-smi runner; BackendUnavailable in one line where the tool is not installed."""
    if shutil.which("npu-smi") is None:
        raise BackendUnavailable("npu-smi is not on PATH (is the Ascend driver and toolkit installed?)")
    return run_tool


def load_hccn_tool() -> str | None:
    """The hccn_tool of this node, or None (an inference card without RoCE ports has none)."""
    found = find_hccn_tool()
    if found is None:
        log.info("hccn_tool_absent", detail="no NPU RoCE ports are reported")
    return found


class AscendNpuCollector:
    """Collector for Ascend NPUs through npu-smi (name "gpu", vendor "ascend"); one chip is one GpuInfo."""

    name = "gpu"
    vendor = VENDOR
    interconnect = "hccs"
    tool = "npu-smi"  # what a "could not check" line names

    def __init__(
        self,
        run: Run,
        sink: FindingSink | None = None,
        fault_codes: str | Path | None = None,
        *,
        hccn: Run | None = None,
        hccn_tool: str = HCCN_TOOL,
    ) -> None:
        self._run = run
        self._sink = sink
        # MindCluster's own table unless the operator names another one.
        self._levels = faults.load_fault_levels(fault_codes) if fault_codes is not None else faults.default_levels()
        self._watch = DeviceWatch(VENDOR, SOURCE)
        self._codes: dict[tuple[int, int], set[str]] = {}  # codes already reported, per (npu, chip)
        self._chip_count: int | None = None
        self.unavailable_reason = ""  # why supported() said no: npu-smi's failure or what it printed
        self._no_hccs: set[tuple[int, int]] = set()  # chips whose npu-smi answers no HCCS query
        self.nic_ports = HccnPortCollector(hccn, self.device_ids, tool=hccn_tool) if hccn is not None else None

    def device_ids(self) -> range:
        """The chips' logical ids (hccn_tool's -i), in npu-smi's order: as many as the last table had."""
        if self._chip_count is None:
            try:
                self._info()
            except CollectorUnsupported:
                return range(0)
        return range(self._chip_count or 0)

    def _info(self) -> list[NpuChip]:
        text = self._run(["npu-smi", "info"])
        chips = parse_npu_smi_info(text)
        self._chip_count = len(chips)
        if not chips:
            # Never "healthy" for a table that was not read: the cycle fails, naming what it printed.
            raise CollectorUnsupported(
                f"npu-smi info printed no NPU this parser can read: {one_line(text) or '(nothing)'}"
            )
        return chips

    def supported(self) -> bool:
        try:
            return bool(self._info())
        except CollectorUnsupported as exc:
            self.unavailable_reason = str(exc)
            return False

    def start_events(self) -> None:
        """npu-smi has no event stream: faults come with each cycle's health reads."""

    def describe(self, inventory: ipb.Inventory) -> None:
        for index, chip in enumerate(self._info()):
            inventory.gpus.add(
                index=index,
                vendor=VENDOR,
                interconnect=self.interconnect,
                pci_bus_id=chip.pci,
                model=f"Ascend {chip.model}" if not chip.model.startswith("Ascend") else chip.model,
                serial=f"npu{chip.npu_id}-chip{chip.chip_id}",
                memory_total_bytes=chip.device_memory_mb[1] * 1024 * 1024,
                link_count=len(hccs.links) if (hccs := self._hccs(chip)) is not None else 0,
            )

    def collect(self, report: tpb.Report) -> list[Finding]:
        out: list[Finding] = []
        for index, chip in enumerate(self._info()):
            gpu = report.gpus.add(index=index, vendor_health=chip.health_raw)
            _fill(gpu, chip)
            if not gpu.lost and (hccs := self._hccs(chip)) is not None and hccs.links:
                for link in hccs.links:
                    sample = gpu.links.add(link=link.link, up=link.up)
                    if link.errors is not None:
                        sample.errors = link.errors
                gpu.links_down = hccs.links_down
            pci = chip.pci
            out.extend(self._watch.judge(gpu, pci))
            out.extend(self._health_findings(index, chip, pci))
        return out

    def close(self) -> None:
        """Nothing held open between cycles."""

    def _hccs(self, chip: NpuChip) -> HccsStatus | None:
        """The chip's HCCS links; None where this npu-smi (or chip) has no HCCS query."""
        key = (chip.npu_id, chip.chip_id)
        if key in self._no_hccs:
            return None
        argv = ["npu-smi", "info", "-t", "hccs", "-i", str(chip.npu_id), "-c", str(chip.chip_id)]
        try:
            return parse_hccs(self._run(argv))
        except CollectorUnsupported as exc:
            log.info("ascend_hccs_unsupported", npu=chip.npu_id, chip=chip.chip_id, error=str(exc))
            self._no_hccs.add(key)
            return None

    def _health_findings(self, index: int, chip: NpuChip, pci: str) -> list[Finding]:
        key = (chip.npu_id, chip.chip_id)
        if chip.health == "ok":
            self._codes.pop(key, None)  # cleared: a code that comes back is a new fault
            return []
        argv = ["npu-smi", "info", "-t", "health", "-i", str(chip.npu_id), "-c", str(chip.chip_id)]
        health = parse_npu_health(self._run(argv))
        seen = self._codes.setdefault(key, set())
        out: list[Finding] = []
        if not health.error_codes and health.health == "critical" and "" not in seen:
            # An alarm npu-smi gives no code for is still an alarm: look at the chip.
            seen.add("")
            out.append(
                self._watch.finding(
                    "accel_fault",
                    index,
                    vocab.ACTION_INVESTIGATE,
                    f"Ascend chip health {health.health_raw} with no error code",
                    code=f"health_{health.health_raw.lower()}",
                    pci=pci,
                    npu=str(chip.npu_id),
                    chip=str(chip.chip_id),
                )
            )
        for code in health.error_codes:
            if code in seen:
                continue
            seen.add(code)
            level = faults.level_of(code, self._levels, health.health)
            action = faults.LEVEL_ACTION[level]
            out.append(
                self._watch.finding(
                    "accel_fault",
                    index,
                    action,
                    f"Ascend fault {code} ({level}), health {health.health_raw}",
                    code=code,
                    pci=pci,
                    level=level,
                    npu=str(chip.npu_id),
                    chip=str(chip.chip_id),
                )
            )
        return out


def _fill(gpu: tpb.GpuSample, chip: NpuChip) -> None:
    if chip.temperature_c is not None:
        gpu.temperature_c = chip.temperature_c
    if chip.power_w is not None:
        gpu.power_w = chip.power_w
    if chip.aicore_pct is not None:
        gpu.utilization_gpu_pct = chip.aicore_pct
    used, total = chip.device_memory_mb
    if total:
        gpu.memory_total_bytes = total * 1024 * 1024
        gpu.memory_used_bytes = used * 1024 * 1024
    if chip.health == "unknown":
        gpu.lost = True  # npu-smi's UNKNOWN: the device does not exist or has not started
