"""TLS settings shared by the agent and the controller (mutual TLS on the telemetry stream)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TLSSettings:
    """PEM files. The controller requires client certificates signed by ``ca_file``; the
    agent verifies the controller against the same CA. A node's certificate names its node
    id (CN or a DNS SAN), and the controller accepts reports only for that node."""

    ca_file: Path
    cert_file: Path
    key_file: Path
