"""LLDP neighbours from lldpd (``lldpcli -f json show neighbors``): which switch port each NIC is cabled to.

The controller needs the physical wiring to tell a bad NIC from a bad switch port and to
check rail alignment (NIC i of every node on the same leaf). The list changes rarely, so
it is sent in full only when it changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

Runner = Callable[[Sequence[str]], str]
LldpNeighbor = ipb.LldpNeighbor
DEFAULT_COMMAND = ("lldpcli", "-f", "json", "show", "neighbors")
_TIMEOUT_S = 5.0


def lldpcli_command(socket: str | None = None) -> tuple[str, ...]:
    """The neighbours command; with ``socket``, asked of the lldpd listening there (``lldpcli -u``).

    One host may run several lldpd (one per network namespace, or a second instance next
    to the system one); each has its own control socket.
    """
    if not socket:
        return DEFAULT_COMMAND
    return ("lldpcli", "-u", socket, *DEFAULT_COMMAND[1:])


def default_runner(argv: Sequence[str]) -> str:
    """Run a command without a shell; raise on failure; return stdout."""
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=_TIMEOUT_S, check=True)
    return res.stdout


def _value(x: Any) -> str:
    """lldpd values are a str, {"value": str}, or a list of either: the first as a string."""
    if isinstance(x, list):
        return _value(x[0]) if x else ""
    if isinstance(x, dict):
        return _value(x.get("value", ""))
    return "" if x is None else str(x)


def _named(obj: Any) -> list[tuple[str, dict[str, Any]]]:
    """``{name: {...}}`` or a list of such dicts -> [(name, {...}), ...]."""
    items = obj if isinstance(obj, list) else [obj]
    out: list[tuple[str, dict[str, Any]]] = []
    for item in items:
        if isinstance(item, dict):
            out.extend((k, v) for k, v in item.items() if isinstance(v, dict))
    return out


def _chassis(raw: Any) -> tuple[str, dict[str, Any]]:
    """(system name, fields): a chassis is keyed by system name, unless it has none."""
    if not isinstance(raw, dict):
        return "", {}
    if "id" in raw and isinstance(raw.get("id"), dict) and "value" in raw["id"]:
        return _value(raw.get("name")), raw  # unnamed chassis: the fields themselves
    for name, fields in raw.items():
        if isinstance(fields, dict):
            return name, fields
    return "", {}


def parse_lldpcli_json(text: str) -> list[LldpNeighbor]:
    """Neighbours from ``lldpcli -f json show neighbors`` output (one, several or none)."""
    doc = json.loads(text) if text.strip() else {}
    lldp = doc.get("lldp") if isinstance(doc, dict) else None
    if not isinstance(lldp, dict):
        return []
    out: list[ipb.LldpNeighbor] = []
    for ifname, entry in _named(lldp.get("interface", [])):
        name, ch = _chassis(entry.get("chassis"))
        raw_port = entry.get("port")
        port: dict[str, Any] = raw_port if isinstance(raw_port, dict) else {}
        out.append(
            ipb.LldpNeighbor(
                local_interface=ifname,
                chassis_name=name,
                chassis_id=_value(ch.get("id")),
                port_id=_value(port.get("id")),
                port_description=_value(port.get("descr")),
                management_address=_value(ch.get("mgmt-ip")),
            )
        )
    return out


def _key(n: ipb.LldpNeighbor) -> tuple[str, ...]:
    return (n.local_interface, n.chassis_name, n.chassis_id, n.port_id, n.port_description, n.management_address)


class LldpCollector:
    """Polls lldpd at most every ``min_interval_s``; reports the list when it changed."""

    name = "lldp"

    def __init__(
        self,
        command: Sequence[str] = DEFAULT_COMMAND,
        runner: Runner | None = None,
        min_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = tuple(command)
        self._runner = runner or default_runner
        self._custom_runner = runner is not None
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last_run: float | None = None
        self._current: list[ipb.LldpNeighbor] | None = None
        self._reported: list[tuple[str, ...]] | None = None
        self._failing = False

    def supported(self) -> bool:
        """True with an injected runner or when the lldpcli binary is on PATH."""
        return self._custom_runner or shutil.which(self.command[0]) is not None

    def neighbors(self) -> list[ipb.LldpNeighbor] | None:
        """Current neighbour list (re-run at most every min_interval_s); None if never read."""
        now = self._clock()
        if self._last_run is not None and now - self._last_run < self.min_interval_s:
            return self._current
        self._last_run = now
        try:
            self._current = parse_lldpcli_json(self._runner(self.command))
        except Exception as e:  # lldpd down, bad JSON, timeout: log, keep the last good list
            emit = log.debug if self._failing else log.warning
            emit("lldp_read_failed", command=" ".join(self.command), error=str(e) or type(e).__name__)
            self._failing = True
            return self._current
        if self._failing:
            log.info("lldp_read_recovered")
        self._failing = False
        return self._current

    def describe(self, inventory: ipb.Inventory) -> None:
        """Fill inventory.lldp_neighbors (empty when lldpd cannot be read)."""
        found = self.neighbors()
        if found:
            inventory.lldp_neighbors.extend(found)

    def collect(self, report: tpb.Report) -> list[Finding]:
        """Set report.lldp only when the neighbour list changed since the last report (or first time)."""
        found = self.neighbors()
        if found is None:
            return []
        keys = sorted(_key(n) for n in found)
        if keys == self._reported:
            return []
        report.lldp.SetInParent()
        report.lldp.neighbors.extend(found)
        if self._reported is not None:
            log.info("lldp_neighbors_changed", before=len(self._reported), after=len(keys))
        self._reported = keys
        return []

    def close(self) -> None:
        """Nothing to release."""
