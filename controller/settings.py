"""The controller's settings: what the settings file's sections become (starpulse.app.config).

Here, below the service and the decision core, so that both read them; ``controller.service``
still exports both names, so older imports keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric
from controller.ha.config import HAConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.base import Scheduler
from controller.jobs.hang import HangConfig
from controller.jobs.stall import StallConfig
from controller.outputs.notify import NotifyConfig
from starpulse.core.auth import AuthConfig, HttpAuthConfig
from starpulse.core.schema import setting
from starpulse.core.tls import TLSSettings

__all__ = ["ControllerConfig", "HealSettings"]


@dataclass
class HealSettings:
    """Self-healing: which scheduler acts, with which policy and guards."""

    scheduler: Scheduler
    policy_path: Path | None = setting(
        None, "Remediation policy file (YAML: incident kind -> action); null: the packaged default policy"
    )
    guards: GuardConfig = field(default_factory=GuardConfig)
    heal: HealConfig = field(default_factory=HealConfig)


@dataclass
class ControllerConfig:
    """Controller settings; units in names. The settings file places them in sections (starpulse.app.config)."""

    listen: str = setting("127.0.0.1:50051", "gRPC address for agents, relays and the CLI", address=True)
    http: str = setting("127.0.0.1:8080", "HTTP address: /metrics, /healthz, /api and the dashboard", address=True)
    db_path: Path = setting(Path("starpulse.db"), "SQLite database: nodes, events, incidents, remediations")
    history_retention_s: float = setting(
        90 * 86400.0,
        "Seconds of raw history kept in the database (events, resolved incidents, remediation transitions, "
        "finished job restarts); older days are kept as daily reliability figures for starpulse report "
        "(docs/reliability.md). 90 days: a quarter's review from the raw rows, and a bounded file",
        gt=0,
    )
    aggregate_retention_s: float = setting(
        730 * 86400.0,
        "Seconds the daily reliability figures are kept (reliability_daily, reliability_job_daily, "
        "reliability_node_daily: what starpulse report reads beyond the raw history); more than "
        "history_retention_s. 2 years: this year's review against last year's, for a few rows a day",
        gt=0,
    )
    heartbeat_timeout_s: float = setting(
        15.0, "Seconds a node may stay silent before it is unreachable: three missed reports at 5 s", gt=0
    )
    sweep_interval_s: float = setting(
        1.0, "Seconds between heartbeat sweeps and detection ticks: a silent node is noticed within this", gt=0
    )
    max_message_bytes: int = setting(
        4 * 1024 * 1024,
        "Bytes: a larger agent message is refused (RESOURCE_EXHAUSTED); 4 MiB holds a full report of a "
        "large node many times over",
        ge=1024,
    )
    rate_per_node_per_s: float = setting(
        200.0, "Messages per second a node may send, sustained; far above one report and its events", gt=0
    )
    rate_burst: float = setting(
        5000.0, "Messages a node may send at once: a replay of its buffered events after an outage fits", ge=1
    )
    report_interval_s: float = setting(
        0.0, "Seconds between reports agents are told to keep; 0: each agent keeps its own", ge=0
    )
    report_ack_interval_s: float = setting(
        10.0,
        "Seconds: report-only acks go out at most this often per stream (event acks at once); a report "
        "lost with a dropped stream is superseded by the next one",
        ge=0,
    )
    relays: list[str] = setting(
        [],
        "Relay ids (their certificates' names) that may carry agents' streams under mutual TLS; plaintext: any relay",
    )
    allowed_nodes: list[str] | None = setting(
        None, "Node ids that may register; null: any valid id, or the declared fabric's nodes"
    )
    fabric: Fabric | None = None  # the declared fabric (or fabric_path); None: no topology root cause
    fabric_path: Path | None = setting(
        None, "Declared fabric file (JSON/YAML from `starpulse topology generate`); null: no topology root cause"
    )
    rules_path: Path | None = setting(None, "Detection rules file; null: the packaged default rules")
    jobs: dict[str, list[str]] = setting(
        {}, "Static job -> nodes placement, until a job registry reports it", example={"llama-70b": ["node-001"]}
    )
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    hang: HangConfig = field(default_factory=HangConfig)  # a job whose steps stop (controller.jobs.hang)
    stall: StallConfig = field(default_factory=StallConfig)  # a job's GPUs busy at idle power (controller.jobs.stall)
    notify: NotifyConfig = field(default_factory=NotifyConfig)  # alert receivers (none: alerts off)
    heal: HealSettings | None = None  # self-healing (None: detect and alert only)
    controller_id: str = setting("controller-0", "This controller's name in acks and logs", nonempty=True)
    grace_s: float = setting(5.0, "Seconds open streams get to end on shutdown before they are cut", ge=0)
    extra_listen: list[str] = setting([], "More gRPC addresses to listen on", address=True)
    # Mutual TLS on the gRPC port (None: plaintext). With it a node may report only as the
    # node id its client certificate names (starpulse.core.tls.peer_node_id).
    tls: TLSSettings | None = None
    # Admin credential and whether reads need it (starpulse.core.auth). Default: dev mode, open.
    auth: AuthConfig = field(default_factory=AuthConfig)
    # The HTTP side: HTTPS on the same certificates, and who may read it (starpulse.core.auth).
    http_auth: HttpAuthConfig = field(default_factory=HttpAuthConfig)
    # Several replicas coordinated by etcd (controller.replica); None: one controller on SQLite.
    ha: HAConfig | None = None
