"""What an incident looks like on the wire: Alertmanager alerts (webhook v4 and API v2) and
the generic signed webhook body.

Labels identify an alert (Alertmanager groups, routes, silences and deduplicates on them),
so they carry only what is stable and low-cardinality for one incident: alertname
(always ``StarpulseIncident``; the kind is its own label, so one route matcher catches
every starpulse alert), incident_id, kind, root_cause, component_type, severity, action.
Everything long or changing goes in annotations. Labels with an empty value are left out,
as Alertmanager treats them as absent (a partition has no root_cause).

The fingerprint is Alertmanager's own (FNV-1a 64 over the sorted label pairs), so a
receiver sees the same id from us and from Alertmanager.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from controller.detect.model import Incident

AlertStatus = Literal["firing", "resolved"]

ALERTNAME = "StarpulseIncident"
ZERO_TIME = "0001-01-01T00:00:00Z"  # what Alertmanager sends as endsAt of a firing alert
MAX_LIST = 20  # affected nodes/jobs listed in an annotation; the rest are counted
MAX_EVIDENCE = 5  # evidence lines in the annotation
MAX_ANNOTATION = 1024  # characters

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEP = 0xFF


def rfc3339(ms: int) -> str:
    """Unix milliseconds as RFC3339 UTC with millisecond precision (``2026-01-02T03:04:05.678Z``)."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's label-set fingerprint: FNV-1a 64 over sorted name, 0xff, value, 0xff; 16 hex digits."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for chunk in (name.encode(), labels[name].encode()):
            for b in chunk:
                h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEP) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def alert_labels(incident: Incident) -> dict[str, str]:
    labels = {
        "alertname": ALERTNAME,
        "incident_id": incident.id,
        "kind": incident.kind,
        "root_cause": incident.root_cause,
        "component_type": incident.component_type,
        "severity": incident.severity,
        "action": incident.action,
    }
    return {k: v for k, v in labels.items() if v}


def _short_list(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LIST])
    if len(items) > MAX_LIST:
        shown += f" (+{len(items) - MAX_LIST} more)"
    return _cut(shown)


def _cut(text: str, limit: int = MAX_ANNOTATION) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary(incident: Incident) -> str:
    where = incident.root_cause or "the fabric (no single root cause)"
    n = len(incident.affected_nodes)
    nodes = f"{n} node{'s' if n != 1 else ''}"
    return f"{incident.severity} {incident.kind} on {where}: {nodes} affected, action {incident.action}"


def alert_annotations(incident: Incident) -> dict[str, str]:
    lines = []
    for ev in incident.evidence[:MAX_EVIDENCE]:
        rule = ev.get("rule", "?")
        comp = ev.get("component", "?")
        msg = ev.get("message", "")
        count = ev.get("count")
        lines.append(f"{rule} on {comp}" + (f" x{count}" if count and count != 1 else "") + (f": {msg}" if msg else ""))
    if len(incident.evidence) > MAX_EVIDENCE:
        lines.append(f"(+{len(incident.evidence) - MAX_EVIDENCE} more)")
    out = {
        "summary": _cut(summary(incident)),
        "affected_nodes": _short_list(incident.affected_nodes),
        "affected_jobs": _short_list(incident.affected_jobs),
        "evidence": _cut("; ".join(lines)),
    }
    return {k: v for k, v in out.items() if v}


def generator_url(incident: Incident, external_url: str) -> str:
    return f"{external_url.rstrip('/')}/api/incidents/{incident.id}" if external_url else ""


def webhook_alert(incident: Incident, status: AlertStatus, external_url: str = "") -> dict[str, Any]:
    """One alert as Alertmanager puts it in a webhook (v4) payload."""
    labels = alert_labels(incident)
    ends = incident.resolved_ms if status == "resolved" else None
    return {
        "status": status,
        "labels": labels,
        "annotations": alert_annotations(incident),
        "startsAt": rfc3339(incident.opened_ms),
        "endsAt": rfc3339(ends) if ends is not None else ZERO_TIME,
        "generatorURL": generator_url(incident, external_url),
        "fingerprint": fingerprint(labels),
    }


def _common(dicts: list[Mapping[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def alertmanager_webhook_payload(
    receiver: str,
    alerts: list[dict[str, Any]],
    status: AlertStatus | None = None,
    external_url: str = "",
) -> dict[str, Any]:
    """The version "4" webhook body Alertmanager would POST for one group of ``alerts``.

    Each notification is one group: the alerts of one incident (grouped by ``incident_id``).
    ``status`` defaults as Alertmanager computes it: firing if any alert is firing.
    """
    if status is None:
        status = "firing" if any(a.get("status") == "firing" for a in alerts) else "resolved"
    common = _common([a["labels"] for a in alerts])
    group_labels = {k: common[k] for k in ("incident_id",) if k in common}
    group_key = '{}/{alertname="%s"}:{%s}' % (  # noqa: UP031 - braces everywhere; % reads clearer
        ALERTNAME,
        ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())),
    )
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common,
        "commonAnnotations": _common([a.get("annotations", {}) for a in alerts]),
        "externalURL": external_url,
        "alerts": alerts,
    }


def api_alert(incident: Incident, status: AlertStatus, external_url: str = "") -> dict[str, Any]:
    """One element of the ``POST /api/v2/alerts`` array, before ``endsAt`` is stamped.

    A firing alert is stored without ``endsAt``; ``stamp_api_alerts`` sets it at send time
    (now + a few resend intervals), so a stored alert never carries a stale deadline.
    """
    alert: dict[str, Any] = {
        "labels": alert_labels(incident),
        "annotations": alert_annotations(incident),
        "startsAt": rfc3339(incident.opened_ms),
    }
    if status == "resolved":
        alert["endsAt"] = rfc3339(incident.resolved_ms if incident.resolved_ms is not None else incident.updated_ms)
    url = generator_url(incident, external_url)
    if url:
        alert["generatorURL"] = url
    return alert


RESEND_LIFETIMES = 4  # a firing alert's endsAt is this many resend intervals ahead


def stamp_api_alerts(alerts: list[dict[str, Any]], now_ms: int, resend_interval_s: float) -> list[dict[str, Any]]:
    """Copies of ``alerts`` with every firing one (no ``endsAt``) given endsAt = now + a few resend intervals.

    Long enough that a late resend does not let Alertmanager resolve it; short enough that a
    controller that dies stops paging within minutes instead of never.
    """
    ends = rfc3339(now_ms + int(RESEND_LIFETIMES * resend_interval_s * 1000))
    return [a if a.get("endsAt") else {**a, "endsAt": ends} for a in alerts]


def alertmanager_api_alerts(
    incidents: list[Incident],
    now_ms: int,
    resend_interval_s: float = 60.0,
    external_url: str = "",
) -> list[dict[str, Any]]:
    """The JSON array for ``POST /api/v2/alerts``: active incidents firing, resolved ones with their end."""
    raw = [api_alert(i, "firing" if i.active else "resolved", external_url) for i in incidents]
    return stamp_api_alerts(raw, now_ms, resend_interval_s)


def generic_payload(
    incident: Incident,
    status: AlertStatus,
    delivery_id: str = "",
    external_url: str = "",
    previous_severity: str | None = None,
) -> dict[str, Any]:
    """The generic webhook body: the whole incident, plus status and ids a receiver deduplicates on."""
    labels = alert_labels(incident)
    body: dict[str, Any] = {
        "version": "1",
        "status": status,
        "delivery_id": delivery_id,
        "fingerprint": fingerprint(labels),
        "summary": summary(incident),
        "url": generator_url(incident, external_url),
        "incident": {
            "id": incident.id,
            "kind": incident.kind,
            "root_cause": incident.root_cause,
            "component_type": incident.component_type,
            "severity": incident.severity,
            "action": incident.action,
            "affected_nodes": list(incident.affected_nodes),
            "affected_jobs": list(incident.affected_jobs),
            "evidence": incident.evidence,
            "opened_at": rfc3339(incident.opened_ms),
            "resolved_at": rfc3339(incident.resolved_ms) if incident.resolved_ms is not None else None,
        },
    }
    if previous_severity is not None:
        body["previous_severity"] = previous_severity
    return body
