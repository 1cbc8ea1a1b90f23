"""Findings from the vendor-neutral sample fields, the same for every non-NVIDIA backend.

Where a fault means the same on every chip (an uncorrectable memory error, a device gone) the
finding is the same shared kind with the same action, so one rule and one policy cover every
vendor; only ``vendor`` and ``vendor_code`` say whose it was. Findings are for transitions
only: the first sample of a device that is already bad counts as one, a steady fault is
reported once. An interconnect link down and a thermal slowdown are states the controller
judges from every report (``links_down``, ``thermal_slowdown``: the rules gpu.link_down and
gpu.thermal_slowdown), not events: NVIDIA's nvlink_down and thermal_slowdown events open
rules that read NVIDIA's own fields, which a non-NVIDIA report would resolve at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb


@dataclass
class _Seen:
    lost: bool = False
    uncorrectable: dict[str, int] = field(default_factory=dict)  # by RAS block ("" for the total)


@dataclass
class DeviceWatch:
    """Per-device last-seen state of one backend; ``judge`` turns a cycle's samples into findings."""

    vendor: str
    source: str
    _seen: dict[int, _Seen] = field(default_factory=dict)

    def finding(
        self, kind: str, index: int, action: str, message: str, *, code: str = "", pci: str = "", **attrs: str
    ) -> Finding:
        """A finding about chip ``index`` of this vendor, graded by its action."""
        return Finding(
            kind=kind,
            component=f"gpu-{index}",
            severity=vocab.severity_for_action(action),
            action=action,
            message=message,
            source=self.source,
            pci=pci or None,
            attributes={k: v for k, v in attrs.items() if v},
            vendor=self.vendor,
            vendor_code=code,
        )

    def judge(self, gpu: tpb.GpuSample, pci: str = "") -> list[Finding]:
        """Findings for what changed on one chip since its last sample."""
        seen = self._seen.setdefault(gpu.index, _Seen())
        out: list[Finding] = []
        if gpu.lost and not seen.lost:
            out.append(self.finding("gpu_lost", gpu.index, vocab.ACTION_REBOOT, "device is lost", pci=pci))
        seen.lost = gpu.lost
        if gpu.lost:
            return out
        counts = {b.block: b.uncorrectable for b in gpu.ras_blocks}
        if not counts and gpu.HasField("memory_errors_uncorrectable"):
            counts[""] = gpu.memory_errors_uncorrectable
        for block, count in counts.items():
            before = seen.uncorrectable.get(block, 0)
            if count > before:
                where = f" in {block}" if block else ""
                out.append(
                    self.finding(
                        "ecc_dbe",
                        gpu.index,
                        vocab.ACTION_RESET_GPU,
                        f"{count - before} new uncorrectable memory error(s){where} ({count} total)",
                        code=block,
                        pci=pci,
                        block=block,
                    )
                )
            seen.uncorrectable[block] = count
        return out
