"""mlx5 (ConnectX) and RDMA driver lines: firmware, health, load failures, TX stalls, links.

What each fault asks for follows NVIDIA's mlx5 documentation: a firmware health failure
(miss count, syndrome, internal error) is a fatal device error that the driver's reset
flow may or may not recover, so the node needs a reboot; a firmware command that times out
or is refused is worth a look; a device that failed to load is missing from the node. A
``Link down`` or ``Cable unplugged`` on a port that this log saw initialise and never come
up is boot-time noise (an unused port), not a fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.collectors.kmsg.family import SOURCE, Family, MatchResult, State
from starpulse.core import vocab
from starpulse.core.findings import Finding

_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_MLX5_RE = re.compile(rf"mlx5_core (?P<pci>{_PCI})(?: (?P<netdev>[^:\s]+))?: (?P<text>.*)")
_PROBE_RE = re.compile(rf"mlx5_core: probe of (?P<pci>{_PCI}) failed")
# pre-6.8 "NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out"
_WATCHDOG_RE = re.compile(r"NETDEV WATCHDOG: (?P<netdev>\S+) \(mlx5_core\): transmit queue (?P<queue>\d+) timed out")
_BOOT_RE = re.compile(r"^firmware version:")
_UP_RE = re.compile(r"\bLink up\b|Link ACTIVE|Port module event: module \d+, Cable plugged", re.IGNORECASE)
_DOWN_RE = re.compile(r"\blink down\b|Port module event: module \d+, Cable unplugged", re.IGNORECASE)
_RECOVERED_RE = re.compile(r"recovered after timeout")


@dataclass(frozen=True)
class Mlx5Fault:
    """One kind of mlx5 line worth a finding."""

    pattern: re.Pattern[str]
    action: str
    severity: str
    reason: str


# Order matters: the first that matches names the line.
FAULTS: tuple[Mlx5Fault, ...] = (
    Mlx5Fault(
        re.compile(
            r"health compromised|Health issue observed|unrecoverable hardware error|health poll failed"
            r"|\bsynd 0x[0-9a-f]+:"
        ),
        vocab.ACTION_REBOOT,
        "critical",
        "firmware health failure",
    ),
    Mlx5Fault(
        re.compile(r"wait_func\S*:.*timeout|No done completion|cmd_work_handler|command timeout", re.IGNORECASE),
        vocab.ACTION_INVESTIGATE,
        "critical",
        "firmware command timeout",
    ),
    Mlx5Fault(
        re.compile(r"mlx5_(?:load|init)_one failed|handle_hca_cap failed|enable hca failed|probe_one.*failed"),
        vocab.ACTION_CONTACT_SUPPORT,
        "critical",
        "device failed to load",
    ),
    Mlx5Fault(
        re.compile(r"NETDEV WATCHDOG|TX timeout detected"), vocab.ACTION_INVESTIGATE, "warning", "TX queue timed out"
    ),
    Mlx5Fault(
        re.compile(r"Port module event\[error\]"), vocab.ACTION_CHECK_LINK, "warning", "transceiver module error"
    ),
    Mlx5Fault(
        re.compile(r"Port module event.*(?:unplugged|Cable error)", re.IGNORECASE),
        vocab.ACTION_CHECK_LINK,
        "warning",
        "transceiver module event",
    ),
    Mlx5Fault(re.compile(r"\blink down\b", re.IGNORECASE), vocab.ACTION_CHECK_LINK, "warning", "link down"),
    Mlx5Fault(
        re.compile(r"mlx5_cmd_out_err|mlx5_cmd_check"), vocab.ACTION_INVESTIGATE, "warning", "firmware command failed"
    ),
    Mlx5Fault(
        re.compile(r"\b(?:fatal|internal) error\b", re.IGNORECASE), vocab.ACTION_INVESTIGATE, "warning", "device error"
    ),
)


def _finding(fault: Mlx5Fault, pci: str, netdev: str, message: str) -> Finding:
    attrs = {"reason": fault.reason}
    if pci:
        attrs["pci"] = pci
    if netdev:
        attrs["netdev"] = netdev
    return Finding(
        kind="nic_driver_error",
        component=netdev or f"mlx5@{pci}",
        severity=fault.severity,
        action=fault.action,
        message=message,
        source=SOURCE,
        pci=pci or None,
        attributes=attrs,
    )


def _boot_noise(pci: str, text: str, state: State) -> bool:
    """Track ports that initialise and come up; a down on one never up since its init is noise."""
    booting: set[str] = state.data.setdefault("booting", set())
    up: set[str] = state.data.setdefault("up", set())
    if _BOOT_RE.match(text):
        booting.add(pci)
        up.discard(pci)
        return False
    if _UP_RE.search(text):
        up.add(pci)
        return False
    return bool(_DOWN_RE.search(text)) and pci in booting and pci not in up


def match_mlx5(message: str, state: State) -> MatchResult:
    """An ``mlx5_core <pci> [netdev]:`` line, a probe failure, or a TX watchdog on mlx5."""
    w = _WATCHDOG_RE.search(message)
    if w is not None:
        return _finding(FAULTS[3], "", w.group("netdev"), message)
    p = _PROBE_RE.search(message)
    if p is not None:
        return _finding(FAULTS[2], p.group("pci"), "", message)
    m = _MLX5_RE.search(message)
    if m is None:
        return None
    pci, netdev, text = m.group("pci"), m.group("netdev") or "", m.group("text")
    if _boot_noise(pci, text, state) or _RECOVERED_RE.search(text):
        return None
    for fault in FAULTS:
        if fault.pattern.search(text):
            return _finding(fault, pci, netdev, message)
    return None


FAMILY = Family(name="mlx5", words=("mlx5_core", "NETDEV WATCHDOG"), matchers=(match_mlx5,))
