"""The relay's settings: its file's sections, its flags, and the one way to its RelayConfig."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from relay.service import RelayConfig
from starpulse.app.config.common import (
    LOG_LEVEL_FLAG,
    TLS_FLAGS,
    LogSection,
    Overrides,
    TLSFiles,
    read_settings,
    tls_settings,
)
from starpulse.core.schema import Flag, Reading, Schema, from_field, gather, section


@dataclass
class RelaySection:
    """This relay: its name, where the agents of its pod connect, where their batches go."""

    relay_id: str = from_field(RelayConfig, "relay_id")
    controllers: list[str] = from_field(RelayConfig, "controllers")
    listen: str = from_field(RelayConfig, "listen")
    linger_s: float = from_field(RelayConfig, "linger_s")
    max_message_bytes: int = from_field(RelayConfig, "max_message_bytes")
    extra_listen: list[str] = from_field(RelayConfig, "extra_listen")


@dataclass
class MetricsSection:
    """Prometheus /metrics of this relay (starpulse_relay_*)."""

    listen: str | None = from_field(RelayConfig, "metrics_listen")


@dataclass
class RelayFile:
    """A relay's settings file, section by section."""

    relay: RelaySection = section(RelaySection)
    metrics: MetricsSection = section(MetricsSection)
    tls: TLSFiles = section(TLSFiles, "Mutual TLS towards agents and the controller: all three files or none")
    log: LogSection = section(LogSection)


SCHEMA = Schema(RelayFile, "relay")

FLAGS = (
    Flag("--controller", "relay.controllers", split=True, help="controller HOST:PORT (repeat or comma-separate)"),
    Flag("--relay-id", "relay.relay_id"),
    Flag("--listen", "relay.listen", metavar="HOST:PORT"),
    Flag(
        "--linger-ms",
        "relay.linger_s",
        scale=0.001,
        metavar="MS",
        help="milliseconds a batch gathers before it goes up (adds to report latency)",
    ),
    Flag("--metrics", "metrics.listen", metavar="HOST:PORT"),
    *TLS_FLAGS,
    LOG_LEVEL_FLAG,
)
ENV_EXAMPLES = ("relay.relay_id=relay-pod3", "relay.controllers=ctl-a:50051,ctl-b:50051")


@dataclass
class RelaySettings:
    """What the relay's settings yield: the service config, and the process's own settings."""

    relay: RelayConfig
    log: LogSection


def load_relay_settings(
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Overrides | None = None,
    *,
    flags: Mapping[str, str] | None = None,
) -> RelaySettings:
    """The relay's file (if any), then the environment, then ``overrides`` (flags); ConfigError otherwise."""
    return read_settings(SCHEMA, path, env, overrides, flags, _build)


load = load_relay_settings


def _build(reading: Reading, s: RelayFile) -> RelaySettings | None:
    """The one function from settings to a RelayConfig (whether they came from a file or flags)."""
    tls = tls_settings(reading, s.tls)
    if reading.errors:
        return None
    return RelaySettings(RelayConfig(**gather(s, RelayConfig), tls=tls), s.log)


def summary(st: RelaySettings) -> str:
    """One line for `starpulse config check`."""
    r = st.relay
    return (
        f"relay {r.relay_id}: controllers {','.join(r.controllers)}, listen {r.listen}, "
        f"linger {r.linger_s * 1000:g} ms, tls {'on' if r.tls else 'off'}"
    )
