"""The words the agent and the controller must agree on, written once.

An agent names a device, grades a finding and reports a clock-event bit; the controller
matches that device, ranks that grade and judges that bit. When each side kept its own copy
they drifted (three PCI forms, two action -> severity maps); here there is one of each.

Vendor-specific vocabulary (clock-event reasons today) is keyed by the accelerator vendor,
so that the AMD and Ascend backends add a row rather than redo an NVIDIA-shaped table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

# -- accelerator vendors ------------------------------------------------------------------

Vendor = Literal["nvidia", "amd", "ascend"]
VENDORS: Final[tuple[Vendor, ...]] = ("nvidia", "amd", "ascend")

# -- severities ---------------------------------------------------------------------------

Severity = Literal["info", "warning", "critical", "fatal"]
SEVERITY_ORDER: Final[dict[str, int]] = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}

# -- recommended actions ------------------------------------------------------------------
# The verbs of NVIDIA's Xid catalog ("resolution buckets"), plus the network-side ones.

ACTION_NONE: Final = "none"
ACTION_RESTART_APP: Final = "restart_app"
ACTION_RESTART_FABRIC_MANAGER: Final = "restart_fabric_manager"
ACTION_RESET_GPU: Final = "reset_gpu"
ACTION_REBOOT: Final = "reboot"
ACTION_CONTACT_SUPPORT: Final = "contact_support"
ACTION_CHECK_LINK: Final = "check_link"
ACTION_INVESTIGATE: Final = "investigate"

ACTIONS: Final[tuple[str, ...]] = (
    ACTION_NONE,
    ACTION_RESTART_APP,
    ACTION_RESTART_FABRIC_MANAGER,
    ACTION_RESET_GPU,
    ACTION_REBOOT,
    ACTION_CONTACT_SUPPORT,
    ACTION_CHECK_LINK,
    ACTION_INVESTIGATE,
)

# What an action implies about how bad the fault is: a finding that recommends a reboot is
# fatal to the node's work; one that needs nothing done is information.
ACTION_SEVERITY: Final[dict[str, str]] = {
    ACTION_NONE: "info",
    ACTION_RESTART_APP: "warning",
    ACTION_INVESTIGATE: "warning",
    ACTION_CHECK_LINK: "warning",
    ACTION_RESTART_FABRIC_MANAGER: "critical",
    ACTION_RESET_GPU: "critical",
    ACTION_CONTACT_SUPPORT: "critical",
    ACTION_REBOOT: "fatal",
}


def severity_for_action(action: str, default: str = "warning") -> str:
    """The severity an action implies; ``default`` for a verb this table does not know."""
    return ACTION_SEVERITY.get(action, default)


# -- incidents ----------------------------------------------------------------------------

INCIDENT_KINDS: Final[tuple[str, ...]] = (
    "gpu_fault",
    "nic_fault",
    "node_fault",
    "host_fault",
    "straggler",
    "switch_fault",
    "link_fault",
    "path_fault",  # loss or delay that probes see but cannot pin to one component yet (issue 29)
    "partition",
    "node_down",
    "agent_conflict",  # two live agents claim one node (issue 32): whose telemetry is it?
    "job_hang",  # a job whose steps stopped (controller.jobs.hang); its suspects, if named, in the evidence
    "other",
)
# Only these may name a node to evict. Switch, link, partition and node_down incidents are the
# fabric's or unknown: evicting their nodes would punish healthy machines for the network.
# A job_hang names a node only when its ranks' stacks or steps single one out (the healer's hang
# path, controller.heal.healer); without one it restarts the job in place and evicts nobody.
EVICTABLE_KINDS: Final[frozenset[str]] = frozenset(
    {"gpu_fault", "node_fault", "nic_fault", "straggler", "host_fault", "job_hang"}
)


def may_evict(kind: str) -> bool:
    """Whether self-healing may take a node out of service for an incident of this kind."""
    return kind in EVICTABLE_KINDS


# -- PCI addresses ------------------------------------------------------------------------
# NVML says "00000000:9B:00.0", sysfs "0000:9b:00.0", the kernel log "PCI:0000:9b:00" (no
# function) and some tools "9b:00.0" (no domain). GB200 nodes have non-zero domains, so the
# domain is kept, never dropped.

_PCI_RE = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.([0-7]))?$")


def canonical_pci(bus_id: str) -> str:
    """Linux's "dddd:bb:dd.f" form of any bus id (lower case, 4-digit domain); unparsable
    text comes back stripped and lower-cased, so it can still be shown and compared."""
    text = bus_id.strip().lower().removeprefix("pci:")
    m = _PCI_RE.fullmatch(text)
    if m is None:
        return text
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function or '0'}"


def pci_key(bus_id: str) -> str:
    """The "dddd:bb:dd" key that matches a device however it was written: the kernel log
    names a GPU without its function, so the function is left out."""
    text = bus_id.strip().lower().removeprefix("pci:")
    m = _PCI_RE.fullmatch(text)
    if m is None:
        return text
    domain, bus, device, _function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


# -- clock-event reasons ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClockEventReason:
    """One bit of a GPU's clock-event (throttle) reasons."""

    bit: int
    name: str  # the vendor's own name, as rules files write it ("HwThermalSlowdown")
    label: str  # the Prometheus label value ("hw_thermal_slowdown")
    slowdown: bool  # the hardware slowed the GPU down (idle, power caps and settings are normal)


# nvmlClocksEventReason* (nvml.h).
_NVIDIA_CLOCK_EVENT_REASONS = (
    ClockEventReason(0x1, "GpuIdle", "gpu_idle", False),
    ClockEventReason(0x2, "ApplicationsClocksSetting", "applications_clocks_setting", False),
    ClockEventReason(0x4, "SwPowerCap", "sw_power_cap", False),
    ClockEventReason(0x8, "HwSlowdown", "hw_slowdown", True),
    ClockEventReason(0x10, "SyncBoost", "sync_boost", False),
    ClockEventReason(0x20, "SwThermalSlowdown", "sw_thermal_slowdown", False),
    ClockEventReason(0x40, "HwThermalSlowdown", "hw_thermal_slowdown", True),
    ClockEventReason(0x80, "HwPowerBrakeSlowdown", "hw_power_brake_slowdown", True),
    ClockEventReason(0x100, "DisplayClockSetting", "display_clock_setting", False),
)

CLOCK_EVENT_REASONS: Final[dict[Vendor, tuple[ClockEventReason, ...]]] = {"nvidia": _NVIDIA_CLOCK_EVENT_REASONS}


def slowdown_bits(vendor: Vendor = "nvidia") -> int:
    """The mask of the reasons that mean the hardware is slowing the GPU down."""
    mask = 0
    for reason in CLOCK_EVENT_REASONS.get(vendor, ()):
        if reason.slowdown:
            mask |= reason.bit
    return mask


# -- NVLink ---------------------------------------------------------------------------------
# The per-link error counters, in NVML's NVML_NVLINK_ERROR_DL_* order (index = counter id).

NVLINK_ERROR_COUNTERS: Final[tuple[str, ...]] = (
    "replay_errors",
    "recovery_errors",
    "crc_flit_errors",
    "crc_data_errors",
    "ecc_data_errors",
)
