"""Findings: what one node's data says is wrong, before the controller correlates it.

A finding becomes an ``Event`` on the wire. Its ``kind`` and ``severity`` are the
lower-case names of the proto enums, so the conversion is mechanical and a typo
fails loudly instead of shipping ``UNSPECIFIED``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starpulse.v1 import telemetry_pb2 as tpb

SEVERITIES = ("info", "warning", "critical", "fatal")


@dataclass
class Finding:
    """One health finding about one component of this node."""

    kind: str  # EventKind name without prefix, lower case: "xid", "gpu_lost", "nic_link_down"
    component: str  # "gpu-3", "mlx5_0/1", "Ethernet8"
    severity: str  # info | warning | critical | fatal
    action: str  # see starpulse.core.vocab.ACTIONS
    message: str
    source: str  # nvml | kmsg | sysfs | sonic | psutil | agent
    xid: int | None = None
    pci: str | None = None
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    attributes: dict[str, str] = field(default_factory=dict)
    vendor: str = ""  # the accelerator's vendor ("amd", "ascend", a plugin's); "" for NVIDIA and non-chips
    vendor_code: str = ""  # the vendor's own fault code ("8C03A000", "UMC")

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding severity {self.severity!r} is not one of {SEVERITIES}")
        event_kind_value(self.kind)  # raises on an unknown kind

    def to_event(self, seq: int = 0) -> tpb.Event:
        """The wire form; seq is assigned by the agent's buffer."""
        return tpb.Event(
            seq=seq,
            timestamp_ms=self.timestamp_ms,
            kind=tpb.EventKind.Name(event_kind_value(self.kind)),
            component=self.component,
            severity="SEVERITY_" + self.severity.upper(),
            message=self.message,
            source=self.source,
            xid=self.xid or 0,
            pci=self.pci or "",
            action=self.action,
            attributes=self.attributes,
            vendor=self.vendor,
            vendor_code=self.vendor_code,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used by `starpulse scan --json`."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "component": self.component,
            "severity": self.severity,
            "action": self.action,
            "message": self.message,
            "source": self.source,
            "timestamp_ms": self.timestamp_ms,
        }
        if self.xid is not None:
            out["xid"] = self.xid
        if self.pci is not None:
            out["pci"] = self.pci
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        if self.vendor:
            out["vendor"] = self.vendor
        if self.vendor_code:
            out["vendor_code"] = self.vendor_code
        return out


def event_kind_value(kind: str) -> int:
    """EventKind enum value for a finding kind; ValueError for an unknown kind."""
    try:
        return tpb.EventKind.Value("EVENT_KIND_" + kind.upper())
    except ValueError:
        raise ValueError(f"unknown finding kind {kind!r}") from None


def event_kind_name(value: int) -> str:
    """Finding kind (lower case) for an EventKind value."""
    return tpb.EventKind.Name(value).removeprefix("EVENT_KIND_").lower()


def severity_name(value: int) -> str:
    return tpb.Severity.Name(value).removeprefix("SEVERITY_").lower()
