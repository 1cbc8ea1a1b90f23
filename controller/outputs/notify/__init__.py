"""Alert notifications: incidents routed to Alertmanager (webhook v4 or API v2) and signed
generic webhooks, through a persistent SQLite outbox with retries. See docs/alerts.md."""

from controller.outputs.notify.config import (
    BackoffConfig,
    NotifyConfig,
    NotifyConfigError,
    ReceiverConfig,
    parse_notify_config,
)
from controller.outputs.notify.notifier import Notifier, NotifierStats
from controller.outputs.notify.outbox import Outbox, OutboxItem
from controller.outputs.notify.signing import sign, verify

__all__ = [
    "BackoffConfig",
    "Notifier",
    "NotifierStats",
    "NotifyConfig",
    "NotifyConfigError",
    "Outbox",
    "OutboxItem",
    "ReceiverConfig",
    "parse_notify_config",
    "sign",
    "verify",
]
