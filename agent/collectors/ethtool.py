"""Selected ``ethtool -S`` counters of each NIC netdev: PFC pause, PHY errors, PCIe and module faults.

sysfs has no PFC or PHY-level counters; mlx5 exposes them only through ethtool. We keep
the few that point at a fault (see telemetry.md section 3.2) instead of shipping the
hundreds of per-queue counters, and run the tool at most every ``min_interval_s``
because it is a fork per netdev. It fills ``NicSample.ethtool_stats`` of samples
already in the report, so it must run after the RDMA collector.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Sequence

import structlog

from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

Runner = Callable[[Sequence[str]], str]

INTERESTING = re.compile(
    r"^(?:"
    r"[rt]x_prio\d_pause(?:_duration)?"
    r"|tx_pause_storm_\w+"
    r"|rx_discards_phy|tx_discards_phy|rx_crc_errors_phy|rx_symbol_err_phy|rx_pcs_symbol_err_phy"
    r"|rx_corrected_bits_phy|link_down_events_phy|rx_out_of_buffer"
    r"|rx_pci_signal_integrity|tx_pci_signal_integrity"
    r"|module_\w+"
    r")$"
)
_LINE_RE = re.compile(r"^\s*([^:]+?):\s*(-?\d+)\s*$")
# The interesting lines only, found in one pass over the whole text ([^\S\n]: blanks within a line).
_INTERESTING_LINE_RE = re.compile(
    r"^[^\S\n]*(" + INTERESTING.pattern[1:-1] + r")[^\S\n]*:[^\S\n]*(-?\d+)[^\S\n]*$", re.MULTILINE
)
_TIMEOUT_S = 2.0


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S`` output -> {name: value}; the header and non-integer lines are ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m:
            value = int(m.group(2))
            if value >= 0:
                out[m.group(1).strip()] = value
    return out


def select_interesting(stats: dict[str, int]) -> dict[str, int]:
    """Only the counters that point at a fault."""
    return {k: v for k, v in stats.items() if INTERESTING.match(k)}


def parse_interesting(text: str) -> dict[str, int]:
    """``select_interesting(parse_ethtool_stats(text))`` in one regex pass.

    An ``ethtool -S`` text has hundreds of lines per netdev, of which about 20 are kept;
    this skips splitting and matching each line in Python.
    """
    out: dict[str, int] = {}
    for m in _INTERESTING_LINE_RE.finditer(text):
        value = int(m.group(2))
        if value >= 0:
            out[m.group(1)] = value
    return out


def default_runner(argv: Sequence[str]) -> str:
    """Run a command without a shell, 2 s timeout; raise on failure; return stdout."""
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=_TIMEOUT_S, check=True)
    return res.stdout


class EthtoolCollector:
    """Adds selected ``ethtool -S`` counters to each NicSample that has a netdev.

    ``netdevs_from_report``: take the netdevs from the report's NicSamples (default);
    when False, only those listed in ``netdevs`` (which also filters in the default mode).
    ``stats_dir``: read ``<stats_dir>/<netdev>`` instead of running the tool (simulator).
    """

    name = "ethtool"

    def __init__(
        self,
        netdevs_from_report: bool = True,
        runner: Runner | None = None,
        stats_dir: str | None = None,
        min_interval_s: float = 10.0,
        netdevs: Collection[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.netdevs_from_report = netdevs_from_report
        self._runner = runner or default_runner
        self._custom_runner = runner is not None
        self.stats_dir = stats_dir
        self.min_interval_s = min_interval_s
        self._allow = set(netdevs) if netdevs is not None else None
        self._clock = clock
        self._cache: dict[str, tuple[float, dict[str, int] | None]] = {}
        self._warned: set[str] = set()

    def supported(self) -> bool:
        """True with a stats_dir or a runner, or when ``ethtool`` is on PATH."""
        return self.stats_dir is not None or self._custom_runner or shutil.which("ethtool") is not None

    def describe(self, inventory: ipb.Inventory) -> None:
        """Nothing to inventory."""

    def _wanted(self, netdev: str) -> bool:
        if not netdev:
            return False
        if self._allow is not None:
            return netdev in self._allow
        return self.netdevs_from_report

    def _fetch(self, netdev: str) -> dict[str, int] | None:
        try:
            if self.stats_dir is not None:
                path = os.path.join(self.stats_dir, netdev)
                if not os.path.exists(path):
                    log.debug("ethtool_stats_missing", netdev=netdev, path=path)
                    return None
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            else:
                text = self._runner(["ethtool", "-S", netdev])
        except Exception as e:  # a tool failure on one netdev must not lose the others
            if netdev not in self._warned:
                self._warned.add(netdev)
                log.warning("ethtool_failed", netdev=netdev, error=str(e) or type(e).__name__)
            else:
                log.debug("ethtool_failed", netdev=netdev, error=str(e) or type(e).__name__)
            return None
        self._warned.discard(netdev)
        return parse_interesting(text)

    def stats(self, netdev: str) -> dict[str, int] | None:
        """Interesting counters of one netdev, re-using values younger than min_interval_s."""
        now = self._clock()
        cached = self._cache.get(netdev)
        if cached is not None and now - cached[0] < self.min_interval_s:
            return cached[1]
        values = self._fetch(netdev)
        self._cache[netdev] = (now, values)
        return values

    def collect(self, report: tpb.Report) -> list[Finding]:
        """Fill ethtool_stats of the report's NicSamples; never returns findings (raw counters only)."""
        for sample in report.nics:
            netdev = sample.netdev
            if not self._wanted(netdev):
                continue
            values = self.stats(netdev)
            if values:
                sample.ethtool_stats.update(values)
        return []

    def close(self) -> None:
        """Nothing to release."""
