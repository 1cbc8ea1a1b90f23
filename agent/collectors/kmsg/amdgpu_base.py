"""What every amdgpu pattern needs: the device a line names, its RAS event id, and the finding.

The driver names the device by its PCI address (``amdgpu 0000:c1:00.0:``); it is kept as
printed, and the agent turns it into the GPU's index as it does for NVIDIA's Xids. Lines the
DRM core prints (``[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ...``) name no device.
"""

from __future__ import annotations

import re

from agent.collectors.kmsg.family import SOURCE
from starpulse.core import vocab
from starpulse.core.findings import Finding

VENDOR = "amd"

_DEVICE_RE = re.compile(r"\bamdgpu (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):")
# What follows the device: "amdgpu: " (most lines), then newer drivers' "{N}" RAS event id.
_REST_RE = re.compile(r"\bamdgpu [0-9a-fA-F:.]+:\s?(?:amdgpu:\s?)?(?:\{(?P<event>\d+)\}\s?)?(?P<rest>.*)$")


def device(message: str) -> str:
    """The PCI address the line names, as printed ("" when it names none)."""
    m = _DEVICE_RE.search(message)
    return m.group("pci") if m else ""


def rest_of(message: str) -> tuple[str, str]:
    """(text after the device and tags, RAS event id or "") of an amdgpu line."""
    m = _REST_RE.search(message)
    if m is None:
        return message, ""
    return m.group("rest"), m.group("event") or ""


def finding(kind: str, pci: str, action: str, code: str, message: str, attrs: dict[str, str] | None = None) -> Finding:
    """One amdgpu finding; severity follows the action as for every vendor."""
    attributes = dict(attrs or {})
    if pci:
        attributes["pci"] = pci
    return Finding(
        kind=kind,
        component=f"gpu@{pci}" if pci else "gpu",
        severity=vocab.severity_for_action(action),
        action=action,
        message=message,
        source=SOURCE,
        pci=pci or None,
        attributes=attributes,
        vendor=VENDOR,
        vendor_code=code,
    )
