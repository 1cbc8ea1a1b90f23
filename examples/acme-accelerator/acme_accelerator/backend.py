"""The Acme backend: reads its chips from ACME_STATE, reports them and their fault codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent.collectors.accel.api import (
    BackendUnavailable,
    DeviceWatch,
    Finding,
    FindingSink,
    inventory_pb2,
    telemetry_pb2,
)

VENDOR = "acme"
# Acme's fault codes and what to do about each (a vendor knows its own catalog).
FAULT_ACTIONS = {"E42": "reset_gpu", "E07": "restart_app", "E99": "contact_support"}


class AcmeCollector:
    """Acme chips as starpulse GPUs (name "gpu", vendor "acme")."""

    name = "gpu"
    vendor = VENDOR
    interconnect = ""

    def __init__(self, state: Path, sink: FindingSink | None = None) -> None:
        self._state = state
        self._sink = sink
        self._watch = DeviceWatch(VENDOR, "acme")
        self._seen: dict[int, set[str]] = {}

    def _read(self) -> list[dict[str, Any]]:
        return list(json.loads(self._state.read_text())["chips"])

    def supported(self) -> bool:
        return self._state.is_file()

    def start_events(self) -> None:
        """Acme has no event stream."""

    def describe(self, inventory: inventory_pb2.Inventory) -> None:
        for index, chip in enumerate(self._read()):
            inventory.gpus.add(
                index=index,
                vendor=VENDOR,
                model=str(chip.get("model", "Acme A1")),
                serial=f"ACME-{index:04d}",
                pci_bus_id=f"0000:{0x40 + index:02x}:00.0",
            )

    def collect(self, report: telemetry_pb2.Report) -> list[Finding]:
        out: list[Finding] = []
        for index, chip in enumerate(self._read()):
            gpu = report.gpus.add(index=index, lost=bool(chip.get("lost", False)))
            if "temperature_c" in chip:
                gpu.temperature_c = float(chip["temperature_c"])
            gpu.memory_errors_uncorrectable = int(chip.get("uncorrectable", 0))
            out.extend(self._watch.judge(gpu))
            codes = set(chip.get("faults", []))
            for code in sorted(codes - self._seen.get(index, set())):
                action = FAULT_ACTIONS.get(code, "investigate")
                out.append(self._watch.finding("accel_fault", index, action, f"Acme fault {code}", code=code))
            self._seen[index] = codes
        return out

    def close(self) -> None:
        """Nothing held open."""


def make(sink: FindingSink | None) -> AcmeCollector:
    """The entry point: the agent calls it with its finding sink."""
    state = os.environ.get("ACME_STATE")
    if not state:
        raise BackendUnavailable("ACME_STATE is not set (the Acme driver's state file)")
    if not Path(state).is_file():
        raise BackendUnavailable(f"ACME_STATE {state}: no such file (is the Acme driver loaded?)")
    return AcmeCollector(Path(state), sink)
