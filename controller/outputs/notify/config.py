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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from controller.detect.model import Incident
from starpulse.core.schema import ConfigError, Reading, Schema, meta, setting
from starpulse.core.vocab import SEVERITY_ORDER, Severity

ReceiverType = Literal["alertmanager_webhook", "alertmanager_api", "webhook"]
RECEIVER_TYPES: tuple[str, ...] = get_args(ReceiverType)


class NotifyConfigError(ConfigError):
    """A notify config that cannot be used; the message names the source and the key."""


@dataclass
class BackoffConfig:
    """Exponential backoff between delivery attempts: initial * multiplier**(n-1), capped, +-jitter."""

    initial_s: float = setting(1.0, "Seconds before the first retry", ge=0.001)
    max_s: float = setting(300.0, "Seconds: the longest delay between attempts", ge=0.001)
    multiplier: float = setting(2.0, "Each delay is the previous one times this", ge=1.0)
    jitter: float = setting(0.2, "Fraction: 0.2 scales each delay by a random factor in [0.8, 1.2]", ge=0.0, lt=1.0)

    def problems(self) -> list[tuple[str, str]]:
        """Checks across keys, reported by the settings reader with the others."""
        if self.max_s < self.initial_s:
            return [("max_s", f"must be >= initial_s ({self.initial_s:g}), got {self.max_s:g}")]
        return []


@dataclass
class ReceiverConfig:
    name: str = field(
        metadata=meta("Required, unique: the receiver's name in metrics and logs", example="ticketing", nonempty=True)
    )
    type: ReceiverType = field(
        metadata=meta("Required: alertmanager_webhook, alertmanager_api or webhook", example="webhook")
    )
    url: str = field(
        metadata=meta(
            "Required: the webhook URL; for alertmanager_api the Alertmanager base URL (/api/v2/alerts is appended)",
            example="https://tickets.example.internal/hooks/starpulse",
            prefix=("http://", "https://"),
        )
    )
    secret: str | None = setting(
        None, "HMAC key; a webhook needs it (or secret_file), the others are signed too when given", nonempty=True
    )
    secret_file: Path | None = setting(
        None, "File holding the HMAC key, read once, trailing newline stripped", example="/etc/starpulse/ticketing.key"
    )
    min_severity: Severity = setting("warning", "Lowest incident severity sent: info, warning or critical")
    kinds: list[str] = setting([], "Incident kinds to send; empty: every kind")
    send_resolved: bool = setting(True, "Also send resolutions (alertmanager_api always does: Alertmanager needs them)")
    timeout_s: float = setting(10.0, "Seconds per delivery request", ge=0.001)
    resend_interval_s: float = setting(60.0, "Seconds: alertmanager_api re-pushes active alerts this often", ge=0.1)
    max_attempts: int = setting(
        0, "Delivery attempts before giving up; 0: until delivered (an outage must not lose alerts)", ge=0
    )
    backoff: BackoffConfig = field(default_factory=BackoffConfig, metadata=meta("Delay between attempts"))
    headers: dict[str, str] = setting({}, "Extra request headers, e.g. {Authorization: Bearer ...}")

    def problems(self) -> list[tuple[str, str]]:
        """Checks across keys, reported by the settings reader with the others."""
        if self.secret is not None and self.secret_file is not None:
            return [("secret", "give secret or secret_file, not both")]
        if self.type == "webhook" and self.secret is None and self.secret_file is None:
            return [("secret", "a 'webhook' receiver must be signed (secret or secret_file)")]
        return []

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
    poll_interval_s: float = setting(1.0, "Seconds: the longest the delivery loop sleeps without being woken", ge=0.01)
    batch_size: int = setting(50, "Outbox items taken per pass", ge=1)
    concurrency: int = setting(8, "Deliveries in flight at once", ge=1)
    retention_s: float = setting(
        7 * 86400.0, "Seconds delivered rows of closed incidents are kept, for deduplication (7 days)", ge=0
    )

    def problems(self) -> list[tuple[str, str]]:
        """Receiver names are unique: metrics and the outbox key on them."""
        seen: set[str] = set()
        out = []
        for i, r in enumerate(self.receivers):
            if r.name in seen:
                out.append((f"receivers[{i}].name", f"duplicate receiver name {r.name!r}"))
            seen.add(r.name)
        return out

    def routed(self, incident: Incident) -> list[ReceiverConfig]:
        return [r for r in self.receivers if r.routes(incident)]

    def receiver(self, name: str) -> ReceiverConfig | None:
        return next((r for r in self.receivers if r.name == name), None)


_SCHEMA = Schema(NotifyConfig, "notify")


def parse_notify_config(
    data: Mapping[str, Any] | None, source: str = "<notify>", base_dir: Path | None = None
) -> NotifyConfig:
    """Build a NotifyConfig from a parsed YAML/JSON mapping; every error names ``source`` and the key.

    The shape is the dataclasses' (``starpulse.core.schema``); ``base_dir`` resolves relative
    ``secret_file`` paths (the config file's folder), read once the shape is right.
    """
    if data is None:
        return NotifyConfig()
    reading = Reading(_SCHEMA, source, dict(data) if isinstance(data, Mapping) else data, base_dir=base_dir)
    cfg = reading.read()
    if cfg is None:
        raise NotifyConfigError(reading.errors)
    for i, r in enumerate(cfg.receivers):
        if r.secret_file is not None:
            try:
                r.secret = r.secret_file.read_text().strip()
            except OSError as e:
                reading.err(f"receivers[{i}].secret_file", f"cannot read {str(r.secret_file)!r}: {e.strerror}")
                continue
            if not r.secret:
                reading.err(f"receivers[{i}].secret_file", f"{str(r.secret_file)!r} is empty")
    if reading.errors:
        raise NotifyConfigError(reading.errors)
    cfg.external_url = cfg.external_url.rstrip("/")
    return cfg
