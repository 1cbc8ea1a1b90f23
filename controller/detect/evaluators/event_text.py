"""The message and evidence of a condition an event opened (the event kind's, and a state
kind's opened early): one place, so both read alike."""

from __future__ import annotations

from typing import Any

from starpulse.core import xid as xidcat
from starpulse.core.findings import event_kind_name
from starpulse.v1 import telemetry_pb2 as tpb


def event_message(comp: str, ev: tpb.Event) -> str:
    if ev.kind == tpb.EVENT_KIND_XID and ev.xid:
        info = xidcat.lookup(ev.xid)
        return f"{comp}: Xid {ev.xid} ({info.mnemonic}): {info.description}"
    return f"{comp}: {ev.message or event_kind_name(ev.kind)}"


def event_evidence(ev: tpb.Event, count: int) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "event": event_kind_name(ev.kind),
        "agent_component": ev.component,
        "source": ev.source,
        "first_event_ts_ms": ev.timestamp_ms,
        "last_event_ts_ms": ev.timestamp_ms,
        "count": count,
    }
    if ev.xid and ev.kind == tpb.EVENT_KIND_SXID:
        evidence["sxid"] = ev.xid  # an NVSwitch code, never to be read (or escalated) as a GPU Xid
    elif ev.xid:
        evidence["xid"] = ev.xid
        if ev.kind == tpb.EVENT_KIND_XID:
            info = xidcat.lookup(ev.xid)
            evidence["mnemonic"] = info.mnemonic
            evidence["catalog_bucket"] = info.immediate
    if ev.action:
        evidence["agent_action"] = ev.action
    if ev.attributes:
        evidence["attributes"] = dict(ev.attributes)
    return evidence
