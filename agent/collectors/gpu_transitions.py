"""What a GPU's samples mean: transition findings from one NVML sample to the next.

The NVML collector (``agent.collectors.gpu``) reads; this module judges. Findings come
only on transitions (on a GPU's first sample any already-bad state counts as one), so a
steady fault is reported once and again only after it clears. The event thread shares
``GpuState`` with ``transitions`` so that a DBE, a lost GPU or a recovery action it
already delivered is not reported a second time; the caller holds the collector's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb

SOURCE = "nvml"

# Clock-event bits that mean the hardware is slowing the GPU down (not idle / power cap).
SLOWDOWN_BITS = vocab.slowdown_bits("nvidia")
_SLOWDOWN_NAMES = {r.bit: r.name for r in vocab.CLOCK_EVENT_REASONS["nvidia"] if r.slowdown}


@dataclass
class GpuIdent:
    """What identifies a GPU in findings; cached so a lost GPU can still be named."""

    index: int
    uuid: str = ""
    pci: str = ""

    @property
    def key(self) -> str:
        return self.uuid or f"index-{self.index}"


@dataclass
class GpuState:
    """Last-seen values of one GPU, for transition detection (guarded by the collector lock)."""

    seen: bool = False
    lost: bool = False
    reset_required: bool = False
    dbe_volatile: int | None = None
    dbe_aggregate: int | None = None
    remap_failure: bool = False
    links_up: dict[int, bool] = field(default_factory=dict)
    links_from: tpb.GpuSample | None = None  # the kept nvlinks message links_up was last set from
    slowdown_bits: int = 0
    recovery_action: int = 0
    # Shared with the event thread so one change is reported once.
    lost_announced: bool = False
    dbe_events_unconsumed: int = 0
    missing_announced: bool = False


# ---- transitions ----------------------------------------------------------------------


def transitions(
    st: GpuState,
    s: tpb.GpuSample,
    ident: GpuIdent,
    merged: tpb.GpuSample | None,
    inventory_links: set[int],
) -> list[Finding]:
    """Findings for what got worse since this GPU's previous sample (or, first time, is bad).

    ``merged``: this cycle's kept nvlinks message (None when the links were read afresh);
    the same object as last time means no link changed. ``inventory_links``: the links
    the GPU had when described, which count as up before the first sample.
    """
    out: list[Finding] = []
    first = not st.seen
    st.seen = True
    st.missing_announced = False

    if s.lost and not st.lost_announced:
        out.append(lost_finding(ident, "NVML: GPU is lost"))
    st.lost_announced = s.lost
    st.lost = s.lost
    if s.lost:
        return out  # nothing else was readable

    if s.reset_required and not st.reset_required:
        out.append(
            gpu_finding(
                "gpu_reset_required",
                ident,
                "critical",
                vocab.ACTION_RESET_GPU,
                "NVML: GPU requires reset",
                nvml_error="GPU requires restart",
            )
        )
    st.reset_required = s.reset_required

    if dbe_increase(st, s, first):
        if st.dbe_events_unconsumed > 0:
            st.dbe_events_unconsumed = 0  # the event thread already reported it
        else:
            out.append(
                dbe_finding(
                    ident,
                    "ECC double-bit error count rose",
                    dbe_volatile=str(s.ecc_dbe_volatile) if s.HasField("ecc_dbe_volatile") else "",
                    dbe_aggregate=str(s.ecc_dbe_aggregate) if s.HasField("ecc_dbe_aggregate") else "",
                )
            )

    if s.HasField("remap_failure"):
        if s.remap_failure and not st.remap_failure:
            out.append(
                gpu_finding(
                    "row_remap_failure",
                    ident,
                    "critical",
                    vocab.ACTION_CONTACT_SUPPORT,
                    "Row remapping failed: no spare rows left for an uncorrectable error",
                    remapped_rows_uncorrectable=str(s.remapped_rows_uncorrectable),
                )
            )
        st.remap_failure = s.remap_failure

    out.extend(_nvlink_transitions(st, s, ident, merged, inventory_links, first))
    out.extend(_slowdown_transition(st, s, ident))

    if s.HasField("recovery_action"):
        value = s.recovery_action
        if value and value != st.recovery_action:
            out.append(recovery_finding(ident, value))
        st.recovery_action = value
    return out


def _nvlink_transitions(
    st: GpuState,
    s: tpb.GpuSample,
    ident: GpuIdent,
    merged: tpb.GpuSample | None,
    inventory_links: set[int],
    first: bool,
) -> list[Finding]:
    out: list[Finding] = []
    same_links = merged is not None and merged is st.links_from
    st.links_from = merged
    for nl in () if same_links else s.nvlinks:
        was_up = st.links_up.get(nl.link, first and nl.link in inventory_links)
        if was_up and not nl.up:
            out.append(
                gpu_finding(
                    "nvlink_down",
                    ident,
                    "critical",
                    vocab.ACTION_RESET_GPU,
                    f"NVLink {nl.link} is down",
                    link=str(nl.link),
                )
            )
        st.links_up[nl.link] = nl.up
    return out


def _slowdown_transition(st: GpuState, s: tpb.GpuSample, ident: GpuIdent) -> list[Finding]:
    if not s.HasField("clock_event_reasons"):
        return []
    bits = s.clock_event_reasons & SLOWDOWN_BITS
    appeared = bits & ~st.slowdown_bits
    st.slowdown_bits = bits
    if not appeared:
        return []
    names = ",".join(n for b, n in _SLOWDOWN_NAMES.items() if bits & b)
    return [
        gpu_finding(
            "thermal_slowdown",
            ident,
            "warning",
            vocab.ACTION_INVESTIGATE,
            f"Hardware clock slowdown: {names}",
            clock_event_reasons=hex(s.clock_event_reasons),
            reasons=names,
        )
    ]


def dbe_increase(st: GpuState, s: tpb.GpuSample, first: bool) -> bool:
    """True when a DBE counter rose (first sample: when it is non-zero); updates baselines."""
    rose = False
    for attr in ("dbe_volatile", "dbe_aggregate"):
        pb_attr = "ecc_" + attr
        if not s.HasField(pb_attr):
            continue
        now = int(getattr(s, pb_attr))
        prev = getattr(st, attr)
        if (prev is None and first and now > 0) or (prev is not None and now > prev):
            rose = True
        setattr(st, attr, now)
    return rose


def missing(
    count: int,
    seen: set[str],
    inventory: Mapping[str, GpuIdent],
    state_for: Callable[[GpuIdent], GpuState],
) -> list[Finding]:
    """gpu_lost for inventory GPUs NVML no longer enumerates (caller holds the lock)."""
    out: list[Finding] = []
    if count >= len(inventory):
        return out
    for key, ident in inventory.items():
        if key in seen:
            continue
        st = state_for(ident)
        if st.missing_announced or st.lost_announced:
            continue
        st.missing_announced = True
        st.lost_announced = True
        out.append(
            lost_finding(
                ident,
                f"GPU no longer enumerated: NVML reports {count} devices, inventory has {len(inventory)}",
                device_count=str(count),
                inventory_count=str(len(inventory)),
            )
        )
    return out


# ---- finding builders -------------------------------------------------------------


def gpu_finding(
    kind: str,
    ident: GpuIdent,
    severity: str,
    action: str,
    message: str,
    *,
    xid: int | None = None,
    **attributes: str,
) -> Finding:
    """A finding about one GPU, named by index, UUID and PCI id; empty attributes dropped."""
    attrs = {k: v for k, v in attributes.items() if v}
    if ident.uuid:
        attrs["uuid"] = ident.uuid
    return Finding(
        kind=kind,
        component=f"gpu-{ident.index}" if ident.index >= 0 else "gpu",
        severity=severity,
        action=action,
        message=message,
        source=SOURCE,
        xid=xid,
        pci=ident.pci or None,
        attributes=attrs,
    )


def lost_finding(ident: GpuIdent, message: str, **attributes: str) -> Finding:
    """A GPU off the bus: Xid 79's meaning and action, whichever way NVML told us."""
    finding = gpu_finding(
        "gpu_lost",
        ident,
        "fatal",
        vocab.ACTION_REBOOT,
        message,
        xid=79,
        xid_mnemonic=xidcat.lookup(79).mnemonic,
        nvml_error="GPU is lost",
    )
    finding.attributes.update(attributes)
    return finding


def dbe_finding(ident: GpuIdent, message: str, **attributes: str) -> Finding:
    """An uncorrectable (double-bit) ECC error: the GPU needs a reset."""
    finding = gpu_finding("ecc_dbe", ident, "critical", vocab.ACTION_RESET_GPU, message)
    finding.attributes.update({k: v for k, v in attributes.items() if v})
    return finding


def recovery_finding(ident: GpuIdent, value: int) -> Finding:
    """The driver's own recovery action (NVML field 281 / event), with the action it names."""
    name, action = xidcat.recovery_action(value)
    return gpu_finding(
        "gpu_recovery_action",
        ident,
        vocab.severity_for_action(action),
        action,
        f"NVML recovery action {value} ({name})",
        recovery_action=str(value),
        recovery_action_name=name,
    )
