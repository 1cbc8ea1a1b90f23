"""Alert receivers and how incidents are routed to them.

A receiver is one HTTP endpoint of one of three types:

- ``alertmanager_webhook``: we POST Alertmanager's own webhook payload (version "4"), so
  anything written for Alertmanager (chat bridges, ticketing hooks) can take starpulse alerts
  without an Alertmanager in between.
- ``alertmanager_api``: we push to a real Alertmanager's ``POST /api/v2/alerts`` (``url`` is
  the Alertmanager base URL); it groups, silences, inhibits and routes from there. Active
  alerts are re-sent every ``resend_interval_s`` because Alertmanager resolves an alert
  whose ``endsAt`` passes.
- ``webhook``: a generic JSON body signed with HMAC-SHA256 (``secret`` or ``secret_file``
  is required), see ``signing.py`` and docs/alerts.md.

Routing: an incident goes to every receiver whose ``min_severity`` is at or below the
incident's severity and whose ``kinds`` include the incident's kind (empty = every kind).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast, get_args

from controller.detect.model import Incident
from starpulse.core.schema import ConfigError, meta, setting
from starpulse.core.vocab import SEVERITY_ORDER, Severity

ReceiverType = Literal["alertmanager_webhook", "alertmanager_api", "webhook"]
RECEIVER_TYPES: tuple[str, ...] = get_args(ReceiverType)


class NotifyConfigError(ConfigError):
    """A notify config that cannot be used; the message names the source and the key."""


@dataclass
class BackoffConfig:
    """Exponential backoff between delivery attempts: initial * multiplier**(n-1), capped, +-jitter."""

    initial_s: float = setting(1.0, "Seconds before the first retry")
    max_s: float = setting(300.0, "Seconds: the longest delay between attempts")
    multiplier: float = setting(2.0, "Each delay is the previous one times this")
    jitter: float = setting(0.2, "Fraction: 0.2 scales each delay by a random factor in [0.8, 1.2]")


@dataclass
class ReceiverConfig:
    name: str = field(metadata=meta("Required, unique: the receiver's name in metrics and logs", example="ticketing"))
    type: ReceiverType = field(
        metadata=meta("Required: alertmanager_webhook, alertmanager_api or webhook", example="webhook")
    )
    url: str = field(
        metadata=meta(
            "Required: the webhook URL; for alertmanager_api the Alertmanager base URL (/api/v2/alerts is appended)",
            example="https://tickets.example.internal/hooks/starpulse",
        )
    )
    secret: str | None = setting(
        None, "HMAC key; a webhook needs it (or secret_file), the others are signed too when given"
    )
    secret_file: Path | None = setting(
        None, "File holding the HMAC key, read once, trailing newline stripped", example="/etc/starpulse/ticketing.key"
    )
    min_severity: Severity = setting("warning", "Lowest incident severity sent: info, warning or critical")
    kinds: list[str] = setting([], "Incident kinds to send; empty: every kind")
    send_resolved: bool = setting(True, "Also send resolutions (alertmanager_api always does: Alertmanager needs them)")
    timeout_s: float = setting(10.0, "Seconds per delivery request")
    resend_interval_s: float = setting(60.0, "Seconds: alertmanager_api re-pushes active alerts this often")
    max_attempts: int = setting(
        0, "Delivery attempts before giving up; 0: until delivered (an outage must not lose alerts)"
    )
    backoff: BackoffConfig = field(default_factory=BackoffConfig, metadata=meta("Delay between attempts"))
    headers: dict[str, str] = setting({}, "Extra request headers, e.g. {Authorization: Bearer ...}")

    def routes(self, incident: Incident) -> bool:
        """Whether this receiver wants the incident (severity threshold and kind filter)."""
        if SEVERITY_ORDER.get(incident.severity, 0) < SEVERITY_ORDER[self.min_severity]:
            return False
        return not self.kinds or incident.kind in self.kinds

    @property
    def key(self) -> bytes | None:
        """The HMAC key, or None when this receiver is not signed."""
        return self.secret.encode() if self.secret else None

    @property
    def post_url(self) -> str:
        if self.type == "alertmanager_api":
            return self.url.rstrip("/") + "/api/v2/alerts"
        return self.url


@dataclass
class NotifyConfig:
    receivers: list[ReceiverConfig] = field(
        default_factory=list, metadata=meta("Where alerts go; none: alerts off (docs/alerts.md)")
    )
    external_url: str = setting("", "This controller's URL, for externalURL and generatorURL in payloads")
    poll_interval_s: float = setting(1.0, "Seconds: the longest the delivery loop sleeps without being woken")
    batch_size: int = setting(50, "Outbox items taken per pass")
    concurrency: int = setting(8, "Deliveries in flight at once")
    retention_s: float = setting(
        7 * 86400.0, "Seconds delivered rows of closed incidents are kept, for deduplication (7 days)"
    )

    def routed(self, incident: Incident) -> list[ReceiverConfig]:
        return [r for r in self.receivers if r.routes(incident)]

    def receiver(self, name: str) -> ReceiverConfig | None:
        return next((r for r in self.receivers if r.name == name), None)


_RECEIVER_KEYS = {f.name for f in fields(ReceiverConfig)}
_BACKOFF_KEYS = {f.name for f in fields(BackoffConfig)}
_TOP_KEYS = {f.name for f in fields(NotifyConfig)}


def parse_notify_config(
    data: Mapping[str, Any] | None, source: str = "<notify>", base_dir: Path | None = None
) -> NotifyConfig:
    """Build a NotifyConfig from a parsed YAML/JSON mapping; errors name ``source`` and the key.

    ``base_dir`` resolves relative ``secret_file`` paths (the config file's folder).
    """
    if data is None:
        return NotifyConfig()
    if not isinstance(data, Mapping):
        raise NotifyConfigError(f"{source}: notify config must be a mapping, not {type(data).__name__}")
    _unknown(data, _TOP_KEYS, source, "")
    cfg = NotifyConfig()
    cfg.external_url = _str(data, "external_url", source, "", default="").rstrip("/")
    cfg.poll_interval_s = _num(data, "poll_interval_s", source, "", cfg.poll_interval_s, minimum=0.01)
    cfg.batch_size = int(_num(data, "batch_size", source, "", cfg.batch_size, minimum=1))
    cfg.concurrency = int(_num(data, "concurrency", source, "", cfg.concurrency, minimum=1))
    cfg.retention_s = _num(data, "retention_s", source, "", cfg.retention_s, minimum=0)
    raw = data.get("receivers", [])
    if not isinstance(raw, list):
        raise NotifyConfigError(f"{source}: receivers: must be a list")
    seen: set[str] = set()
    for i, item in enumerate(raw):
        r = _receiver(item, source, f"receivers[{i}].", base_dir)
        if r.name in seen:
            raise NotifyConfigError(f"{source}: receivers[{i}].name: duplicate receiver name {r.name!r}")
        seen.add(r.name)
        cfg.receivers.append(r)
    return cfg


# Complexity over 15 on purpose: one check per receiver key, each error naming the file and key.
def _receiver(item: Any, source: str, at: str, base_dir: Path | None) -> ReceiverConfig:  # noqa: C901
    if not isinstance(item, Mapping):
        raise NotifyConfigError(f"{source}: {at.rstrip('.')}: must be a mapping")
    _unknown(item, _RECEIVER_KEYS, source, at)
    name = _str(item, "name", source, at)
    if not name:
        raise NotifyConfigError(f"{source}: {at}name: must not be empty")
    rtype = _str(item, "type", source, at)
    if rtype not in RECEIVER_TYPES:
        raise NotifyConfigError(f"{source}: {at}type: {rtype!r} is not one of {', '.join(RECEIVER_TYPES)}")
    url = _str(item, "url", source, at)
    if not url.startswith(("http://", "https://")):
        raise NotifyConfigError(f"{source}: {at}url: {url!r} is not an http(s) URL")
    r = ReceiverConfig(name=name, type=cast(ReceiverType, rtype), url=url)
    secret = item.get("secret")
    secret_file = item.get("secret_file")
    if secret is not None and secret_file is not None:
        raise NotifyConfigError(f"{source}: {at}secret: give secret or secret_file, not both")
    if secret is not None:
        if not isinstance(secret, str) or not secret:
            raise NotifyConfigError(f"{source}: {at}secret: must be a non-empty string")
        r.secret = secret
    elif secret_file is not None:
        if not isinstance(secret_file, str | Path):
            raise NotifyConfigError(f"{source}: {at}secret_file: must be a path")
        path = Path(secret_file)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            text = path.read_text().strip()
        except OSError as e:
            raise NotifyConfigError(f"{source}: {at}secret_file: cannot read {str(path)!r}: {e.strerror}") from e
        if not text:
            raise NotifyConfigError(f"{source}: {at}secret_file: {str(path)!r} is empty")
        r.secret_file, r.secret = path, text
    if r.type == "webhook" and not r.secret:
        raise NotifyConfigError(f"{source}: {at}secret: a 'webhook' receiver must be signed (secret or secret_file)")
    sev = _str(item, "min_severity", source, at, default=r.min_severity)
    if sev not in SEVERITY_ORDER:
        raise NotifyConfigError(f"{source}: {at}min_severity: {sev!r} is not one of {', '.join(SEVERITY_ORDER)}")
    r.min_severity = cast(Severity, sev)
    kinds = item.get("kinds", [])
    if not isinstance(kinds, list) or not all(isinstance(k, str) and k for k in kinds):
        raise NotifyConfigError(f"{source}: {at}kinds: must be a list of incident kinds")
    r.kinds = list(kinds)
    send_resolved = item.get("send_resolved", True)
    if not isinstance(send_resolved, bool):
        raise NotifyConfigError(f"{source}: {at}send_resolved: must be true or false")
    r.send_resolved = send_resolved
    r.timeout_s = _num(item, "timeout_s", source, at, r.timeout_s, minimum=0.001)
    r.resend_interval_s = _num(item, "resend_interval_s", source, at, r.resend_interval_s, minimum=0.1)
    r.max_attempts = int(_num(item, "max_attempts", source, at, r.max_attempts, minimum=0))
    headers = item.get("headers", {})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise NotifyConfigError(f"{source}: {at}headers: must map header names to strings")
    r.headers = dict(headers)
    b = item.get("backoff", {})
    if not isinstance(b, Mapping):
        raise NotifyConfigError(f"{source}: {at}backoff: must be a mapping")
    _unknown(b, _BACKOFF_KEYS, source, f"{at}backoff.")
    bo = BackoffConfig()
    bo.initial_s = _num(b, "initial_s", source, f"{at}backoff.", bo.initial_s, minimum=0.001)
    bo.max_s = _num(b, "max_s", source, f"{at}backoff.", bo.max_s, minimum=bo.initial_s)
    bo.multiplier = _num(b, "multiplier", source, f"{at}backoff.", bo.multiplier, minimum=1.0)
    bo.jitter = _num(b, "jitter", source, f"{at}backoff.", bo.jitter, minimum=0.0)
    if bo.jitter >= 1.0:
        raise NotifyConfigError(f"{source}: {at}backoff.jitter: must be below 1.0 (a fraction of the delay)")
    r.backoff = bo
    return r


def _unknown(data: Mapping[str, Any], known: set[str], source: str, at: str) -> None:
    extra = sorted(str(k) for k in data if k not in known)
    if extra:
        raise NotifyConfigError(f"{source}: {at}{extra[0]}: unknown key (known: {', '.join(sorted(known))})")


_MISSING = object()


def _str(data: Mapping[str, Any], key: str, source: str, at: str, default: Any = _MISSING) -> str:
    value = data.get(key, default)
    if value is _MISSING:
        raise NotifyConfigError(f"{source}: {at}{key}: required")
    if not isinstance(value, str):
        raise NotifyConfigError(f"{source}: {at}{key}: must be a string")
    return value


def _num(data: Mapping[str, Any], key: str, source: str, at: str, default: float, minimum: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NotifyConfigError(f"{source}: {at}{key}: must be a number")
    if value < minimum:
        raise NotifyConfigError(f"{source}: {at}{key}: must be >= {minimum}")
    return float(value)
