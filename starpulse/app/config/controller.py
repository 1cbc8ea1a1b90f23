"""The controller's settings: its file's sections, its flags, and the one way to its ControllerConfig.

A section's key that belongs to a service dataclass takes that field (``from_field``): its
default and doc are written once, there. What only the file has (the switches that turn
healing and HA on, the scheduler's options, the token file) is declared here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from controller.detect.correlate import CorrelationConfig
from controller.detect.failslow import FailSlowConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, load_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.ha.config import HAConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.base import Scheduler
from controller.jobs.hang import HangConfig
from controller.jobs.stall import StallConfig
from controller.outputs.notify import NotifyConfig, NotifyConfigError, parse_notify_config
from controller.service import ControllerConfig, HealSettings
from starpulse.app.config.common import (
    LOG_LEVEL_FLAG,
    TLS_FLAGS,
    LogSection,
    Overrides,
    TLSFiles,
    check_node_id,
    check_path,
    read_settings,
    tls_settings,
)
from starpulse.core.auth import AuthConfig, AuthConfigError, HttpAuthConfig, load_tokens
from starpulse.core.schema import Flag, Reading, Schema, from_field, gather, section, setting
from starpulse.core.tls import TLSSettings


# -- the file's sections ----------------------------------------------------------------------
@dataclass
class ServerSection:
    """Where the controller listens and keeps its state."""

    listen: str = from_field(ControllerConfig, "listen")
    http: str = from_field(ControllerConfig, "http")
    db_path: Path = from_field(ControllerConfig, "db_path")
    history_retention_s: float = from_field(ControllerConfig, "history_retention_s")
    aggregate_retention_s: float = from_field(ControllerConfig, "aggregate_retention_s")
    controller_id: str = from_field(ControllerConfig, "controller_id")
    grace_s: float = from_field(ControllerConfig, "grace_s")
    extra_listen: list[str] = from_field(ControllerConfig, "extra_listen")


@dataclass
class IngestSection:
    """What the controller takes from agents and relays, and how fast."""

    heartbeat_timeout_s: float = from_field(ControllerConfig, "heartbeat_timeout_s")
    sweep_interval_s: float = from_field(ControllerConfig, "sweep_interval_s")
    max_message_bytes: int = from_field(ControllerConfig, "max_message_bytes")
    rate_per_node_per_s: float = from_field(ControllerConfig, "rate_per_node_per_s")
    rate_burst: float = from_field(ControllerConfig, "rate_burst")
    report_interval_s: float = from_field(ControllerConfig, "report_interval_s")
    report_ack_interval_s: float = from_field(ControllerConfig, "report_ack_interval_s")
    relays: list[str] = from_field(ControllerConfig, "relays")


@dataclass
class FabricSection:
    """The declared fabric (root cause on the topology), who may register, static job placement."""

    path: Path | None = from_field(ControllerConfig, "fabric_path")
    allowed_nodes: list[str] | None = from_field(ControllerConfig, "allowed_nodes")
    jobs: dict[str, list[str]] = from_field(ControllerConfig, "jobs")


@dataclass
class DetectionSection:
    """Rules, fail-slow peer comparison, correlation into incidents, detection shards."""

    rules_path: Path | None = from_field(ControllerConfig, "rules_path")
    failslow_every_s: float = from_field(DetectionConfig, "failslow_every_s")
    workers: int = from_field(DetectionConfig, "workers")
    correlation: CorrelationConfig = section(
        CorrelationConfig, "Grouping conditions into incidents on the fabric: how long to wait, how many make a pattern"
    )
    failslow: FailSlowConfig = section(FailSlowConfig, "Fail-slow: a node markedly slower than its peers")
    hang: HangConfig = section(HangConfig, "Hangs: a job whose steps stop moving, judged against its own step time")
    stall: StallConfig = section(
        StallConfig, "Hangs without the job library: a job's GPUs busy at idle power, its RDMA traffic flat"
    )
    probes: ProbeConfig = section(
        ProbeConfig, "Probe mesh (issue 29): who probes whom on the rails, the budget, and localising what probes see"
    )


@dataclass
class SlurmOptions:
    """heal.scheduler.type slurm: the Slurm client commands."""

    conf_path: Path | None = setting(None, "SLURM_CONF for the client commands; null: Slurm's default")
    bin_dir: Path | None = setting(None, "Folder of scontrol, sinfo, squeue and scancel; null: from PATH")
    timeout_s: float = setting(30.0, "Seconds per command", gt=0)
    reason_prefix: str = setting("starpulse:", "Drain reasons starting with this are ours", nonempty=True)
    requeue_settle_s: float = setting(1.1, "Seconds to wait after a requeue before checking it", ge=0)
    requeue_end_timeout_s: float = setting(60.0, "Seconds to wait for a requeued job to end", gt=0)
    start_wait_s: float = setting(10.0, "Seconds to wait for a requeued job to start", ge=0)
    signal_scope: Literal["full", "batch"] = setting("full", "Which job steps a checkpoint signal reaches")
    poll_s: float = setting(0.2, "Seconds between polls while waiting", gt=0)


@dataclass
class KubernetesOptions:
    """heal.scheduler.type kubernetes: cordon, taint and evict through the API server."""

    config_file: Path | None = setting(None, "kubeconfig when not in a cluster; null: in-cluster, else ~/.kube/config")
    noexecute_on_drain: bool = setting(False, "Also taint NoExecute when draining")
    grace_period_s: int | None = setting(None, "Seconds of pod eviction grace; null: each pod's own", ge=0)
    request_timeout_s: float = setting(30.0, "Seconds per API request", gt=0)


@dataclass
class ExecOptions:
    """heal.scheduler.type exec: your own hooks (deploy/hooks)."""

    hooks: dict[str, list[str]] = setting(
        {},
        "Action -> argv; actions: cordon, drain, resume, requeue, signal_job, node_status, job_nodes, list_nodes",
        example={"drain": ["/usr/local/bin/drain-node"], "resume": ["/usr/local/bin/resume-node"]},
    )
    timeout_s: float = setting(60.0, "Seconds per hook", gt=0)
    env: dict[str, Any] = setting({}, "Extra environment for the hooks, NAME: value")


@dataclass
class SimOptions:
    """heal.scheduler.type sim: an in-memory scheduler (demos, tests)."""

    nodes: list[str] = setting([], "Simulated nodes; empty: the declared fabric's (fabric.path then required)")
    reason_prefix: str = setting("starpulse:", "Drain reasons starting with this are ours", nonempty=True)


@dataclass
class SchedulerSection:
    """Which scheduler acts; only that type's options are used."""

    type: Literal["slurm", "kubernetes", "exec", "sim"] = setting("slurm", "The scheduler that acts")
    slurm: SlurmOptions = section(SlurmOptions)
    kubernetes: KubernetesOptions = section(KubernetesOptions)
    exec: ExecOptions = section(ExecOptions)
    sim: SimOptions = section(SimOptions)


@dataclass
class HealSection:
    """Self-healing: the policy, the guards, the scheduler that acts (docs/runbook.md)."""

    policy_path: Path | None = from_field(HealSettings, "policy_path")
    checkpoint_timeout_s: float = from_field(HealConfig, "checkpoint_timeout_s")
    action_retries: int = from_field(HealConfig, "action_retries")
    retry_delay_s: float = from_field(HealConfig, "retry_delay_s")
    repair_poke_s: float = from_field(HealConfig, "repair_poke_s")
    repair_poll_s: float = from_field(HealConfig, "repair_poll_s")
    guards: GuardConfig = section(GuardConfig, "Limits on automatic remediation; shares are fractions of the fleet")
    scheduler: SchedulerSection = section(SchedulerSection)


@dataclass
class AuthSection:
    """Admin API credentials (starpulse.core.auth); no tokens and no certificate names: admin calls are open."""

    admin_token_file: Path | None = setting(None, "File of admin bearer tokens, one a line (# comments); null: none")
    open_reads: bool = from_field(AuthConfig, "open_reads")
    admin_cert_names: list[str] = from_field(AuthConfig, "admin_cert_names")


HTTP_TOKEN_ENV = "STARPULSE_HTTP_TOKEN"


@dataclass
class HttpSection:
    """The HTTP side (dashboard, /api, /metrics): HTTPS on the tls section's files, and who may read it."""

    tls: bool = from_field(HttpAuthConfig, "tls")
    require_auth: bool = from_field(HttpAuthConfig, "require_auth")
    token_file: Path | None = setting(
        None, f"File of HTTP bearer tokens, one a line (# comments); ${HTTP_TOKEN_ENV} adds one; null: none"
    )
    cert_names: list[str] = from_field(HttpAuthConfig, "cert_names")
    metrics: Literal["open", "auth"] = from_field(HttpAuthConfig, "metrics")


@dataclass
class ControllerFile:
    """A controller's settings file, section by section."""

    server: ServerSection = section(ServerSection)
    ingest: IngestSection = section(IngestSection)
    fabric: FabricSection = section(FabricSection)
    detection: DetectionSection = section(DetectionSection)
    notify: dict[str, Any] = setting(
        {},
        "Alert receivers and their delivery (docs/alerts.md); the notify parser checks them, its errors "
        "name notify.<key>",
        shape=NotifyConfig,
    )
    heal: HealSection | None = section(
        HealSection,
        switch="enabled",
        switch_doc="Act on incidents through the scheduler; false: detect and alert only",
    )
    ha: HAConfig | None = section(
        HAConfig,
        "High availability: two or three replicas, the leader elected through an etcd lease (docs/runbook.md); "
        "server.db_path is then this replica's local copy",
        switch="enabled",
        switch_doc="Run as one of several replicas; false: one controller on SQLite",
    )
    tls: TLSFiles = section(TLSFiles, "Mutual TLS on the gRPC port: all three files or none (none: plaintext)")
    auth: AuthSection = section(AuthSection)
    http: HttpSection = section(HttpSection)
    log: LogSection = section(LogSection)


SCHEMA = Schema(ControllerFile, "controller")


# -- flags --------------------------------------------------------------------------------------
def _scheduler_flag(value: str) -> dict[str, Any]:
    if value == "none":
        return {"heal.enabled": False}
    return {"heal.enabled": True, "heal.scheduler.type": value}


def _etcd_flag(value: list[str]) -> dict[str, Any]:
    return {"ha.enabled": True, "ha.etcd": value} if value else {}


FLAGS = (
    Flag("--listen", "server.listen", metavar="HOST:PORT"),
    Flag("--http", "server.http", metavar="HOST:PORT"),
    Flag("--db", "server.db_path", metavar="PATH"),
    Flag("--heartbeat-timeout-s", "ingest.heartbeat_timeout_s", metavar="SECONDS"),
    Flag("--fabric", "fabric.path", metavar="FILE"),
    Flag("--rules", "detection.rules_path", metavar="FILE"),
    Flag("--detect-workers", "detection.workers", metavar="N"),
    Flag(
        "--notify", "notify", file=True, metavar="FILE", help="alert receivers file (YAML: notify keys; docs/alerts.md)"
    ),
    Flag(
        "--scheduler",
        "heal.scheduler.type",
        choices=("none", "slurm", "kubernetes", "exec", "sim"),
        default="none",
        help="self-healing scheduler (default: none, detect and alert only): slurm (its client commands), "
        "kubernetes (cordon and evict through the API server), exec (your hooks, heal.scheduler.exec), "
        "sim (in memory, over the --fabric nodes)",
        to=_scheduler_flag,
    ),
    Flag("--heal-mode", "heal.guards.mode", help="with --scheduler: act, only log, or act on a person's approval"),
    *TLS_FLAGS,
    Flag(
        "--admin-token-file",
        "auth.admin_token_file",
        metavar="PATH",
        help="admin tokens, one per line: Admin RPCs then need one (default: admin open, dev mode)",
    ),
    Flag(
        "--require-read-token",
        "auth.open_reads",
        action="store_true",
        help="Query RPCs (nodes, events, incidents, topology) need an admin token too",
        to=lambda value: {"auth.open_reads": not value},
    ),
    Flag(
        "--admin-cert-name",
        "auth.admin_cert_names",
        metavar="NAME",
        help="with mutual TLS: a client certificate naming NAME counts as admin (repeatable)",
    ),
    Flag(
        "--etcd",
        "ha.etcd",
        split=True,
        metavar="HOST:PORT",
        help="run as one of several replicas, leader elected through this etcd (repeat or comma-separate)",
        to=_etcd_flag,
    ),
    Flag("--ha-lease-ttl", "ha.lease_ttl_s", metavar="SECONDS"),
    Flag("--ha-cluster", "ha.cluster"),
    Flag("--advertise", "ha.advertise", metavar="HOST:PORT"),
    Flag(
        "--http-token-file",
        "http.token_file",
        metavar="PATH",
        help=f"HTTP bearer tokens, one per line (or ${HTTP_TOKEN_ENV}); the dashboard and /api then need one",
        to=lambda value: {"http.token_file": value, "http.require_auth": True},
    ),
    Flag("--http-metrics", "http.metrics", help="/metrics: open to a plain scrape, or behind the HTTP credential"),
    LOG_LEVEL_FLAG,
)
ENV_EXAMPLES = ("ingest.heartbeat_timeout_s=30", "heal.guards.mode=dry_run", "fabric.allowed_nodes=node-001,node-002")


# -- building -----------------------------------------------------------------------------------
@dataclass
class ControllerSettings:
    """What the controller's settings yield: the service config, and the process's own settings."""

    controller: ControllerConfig
    tls: TLSSettings | None
    log: LogSection
    settings: ControllerFile  # as read, section by section


def load_controller_settings(
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Overrides | None = None,
    *,
    connect: bool = True,
    flags: Mapping[str, str] | None = None,
) -> ControllerSettings:
    """Read the file (if any), then the environment, then ``overrides`` (flags); ConfigError lists every problem.

    ``env`` None reads os.environ. ``flags`` (key -> flag) name the running command's flags
    in messages. With ``connect=False`` the kubernetes scheduler is not constructed (it reads
    kubeconfig), as ``config check`` needs.
    """
    environ = os.environ if env is None else env
    return read_settings(
        SCHEMA, path, environ, overrides, flags, lambda reading, s: _build(reading, s, connect, environ)
    )


load = load_controller_settings


def load_controller_config(
    path: str | Path | None, env: Mapping[str, str] | None = None, overrides: Overrides | None = None
) -> ControllerConfig:
    """The ControllerConfig of a controller's settings (see load_controller_settings)."""
    return load_controller_settings(path, env, overrides).controller


def _build(reading: Reading, s: ControllerFile, connect: bool, env: Mapping[str, str]) -> ControllerSettings | None:
    """The one function from settings to a ControllerConfig (whether they came from a file or flags)."""
    for i, node in enumerate(s.fabric.allowed_nodes or []):
        check_node_id(reading, f"fabric.allowed_nodes[{i}]", node)
    for job, nodes in s.fabric.jobs.items():
        for i, node in enumerate(nodes):
            check_node_id(reading, f"fabric.jobs.{job}[{i}]", node)
    check_path(reading, "server.db_path", s.server.db_path, "file")
    if s.server.aggregate_retention_s <= s.server.history_retention_s:
        reading.err(
            "server.aggregate_retention_s",
            f"{s.server.aggregate_retention_s:g} s must be more than server.history_retention_s "
            f"({s.server.history_retention_s:g} s): the daily figures hold the days the raw rows no longer do",
        )
    # Referenced files are read later (and by `config check`): here only a path that cannot be one.
    check_path(reading, "fabric.path", s.fabric.path, "file")
    check_path(reading, "detection.rules_path", s.detection.rules_path, "file")
    if s.heal is not None:
        check_path(reading, "heal.policy_path", s.heal.policy_path, "file")
    notify = _notify(reading, s.notify)
    auth = _auth(reading, s.auth)
    tls = tls_settings(reading, s.tls)
    http_auth = _http_auth(reading, s.http, env, tls)
    fabric, heal = _heal(reading, s, connect)
    if reading.errors or notify is None or auth is None or http_auth is None:
        return None
    fields = gather(s, ControllerConfig)
    if fabric is not None:  # loaded already: the simulated scheduler runs its nodes
        fields["fabric_path"] = None
    detection = DetectionConfig(
        s.detection.correlation, s.detection.failslow, s.detection.probes, **gather(s.detection, DetectionConfig)
    )
    config = ControllerConfig(
        **fields,
        fabric=fabric,
        detection=detection,
        hang=s.detection.hang,
        stall=s.detection.stall,
        notify=notify,
        heal=heal,
        ha=s.ha,
        tls=tls,
        auth=auth,
        http_auth=http_auth,
    )
    return ControllerSettings(config, tls, s.log, s)


def _notify(reading: Reading, raw: dict[str, Any]) -> NotifyConfig | None:
    try:
        return parse_notify_config(raw, "\0", base_dir=reading.base_dir_of("notify"))
    except NotifyConfigError as exc:  # each "\0: key: problem", keyed below notify
        for line in exc.errors:
            key, sep, rest = line.removeprefix("\0: ").partition(": ")
            if sep:
                reading.err(f"notify.{key}", rest)
            else:
                reading.err("notify", key)
        return None


def _auth(reading: Reading, a: AuthSection) -> AuthConfig | None:
    try:
        tokens = load_tokens(a.admin_token_file) if a.admin_token_file is not None else None
        return AuthConfig(admin_tokens=tokens, open_reads=a.open_reads, admin_cert_names=list(a.admin_cert_names))
    except AuthConfigError as exc:
        reading.err("auth", str(exc))
        return None


def _http_auth(
    reading: Reading, h: HttpSection, env: Mapping[str, str], tls: TLSSettings | None
) -> HttpAuthConfig | None:
    """The HTTP side's credentials: tokens from http.token_file and $STARPULSE_HTTP_TOKEN (never logged)."""
    tokens: list[str] = []
    if h.token_file is not None:
        try:
            tokens = load_tokens(h.token_file, "HTTP")
        except AuthConfigError as exc:
            reading.err("http.token_file", str(exc))
            return None
    if env.get(HTTP_TOKEN_ENV):
        tokens.append(env[HTTP_TOKEN_ENV].strip())
    certs = tls is not None and h.tls
    if h.require_auth and not tokens and not certs:
        reading.err(
            "http.require_auth",
            f"needs a token (http.token_file or ${HTTP_TOKEN_ENV}) or client certificates (the tls section)",
        )
        return None
    if h.cert_names and not certs:
        reading.err("http.cert_names", "client certificates need the tls section (and http.tls true)")
        return None
    try:
        return HttpAuthConfig(
            tls=h.tls,
            require_auth=h.require_auth,
            cert_names=list(h.cert_names),
            metrics=h.metrics,
            tokens=tokens or None,
        )
    except AuthConfigError as exc:
        reading.err("http.token_file" if h.token_file is not None else HTTP_TOKEN_ENV, str(exc))
        return None


def _heal(reading: Reading, s: ControllerFile, connect: bool) -> tuple[Fabric | None, HealSettings | None]:
    """(the fabric, when the simulated scheduler needed it; the HealSettings, None when healing is off)."""
    h = s.heal
    if h is None:
        return None, None
    kind = h.scheduler.type
    options: Any = getattr(h.scheduler, kind)
    fabric = None
    if any("fabric.path" in line for line in reading.errors):
        return None, None  # said once, where the path was checked
    try:
        if kind == "sim" and not options.nodes:
            if s.fabric.path is None:
                reading.err("heal.scheduler.sim.nodes", f"is required when {reading.name('fabric.path')} is not set")
                return None, None
            fabric = load_fabric(s.fabric.path)
        scheduler = _scheduler(kind, options, fabric, connect)
    except (OSError, ValueError) as exc:
        reading.err(f"heal.scheduler.{kind}", str(exc))
        return None, None
    if scheduler is None:
        return fabric, None
    heal = HealConfig(**gather(h, HealConfig))
    return fabric, HealSettings(scheduler, policy_path=h.policy_path, guards=h.guards, heal=heal)


def _scheduler(kind: str, o: Any, fabric: Fabric | None, connect: bool) -> Scheduler | None:
    if kind == "slurm":
        from controller.heal.scheduler.slurm import SlurmScheduler

        slurm = SlurmScheduler(**vars(o))
        missing = slurm.missing_tools()
        if missing:
            where = f"in {o.bin_dir}" if o.bin_dir is not None else "on PATH (or set heal.scheduler.slurm.bin_dir)"
            raise ValueError(f"{', '.join(missing)} not found {where}: Slurm healing needs its client commands")
        if o.conf_path is not None and not Path(o.conf_path).is_file():
            raise ValueError(f"conf_path {o.conf_path}: no such file")
        return slurm
    if kind == "kubernetes":
        if not connect:
            return None
        from controller.heal.scheduler.kubernetes import KubernetesScheduler

        return KubernetesScheduler(**vars(o))
    if kind == "exec":
        from controller.heal.scheduler.exec import ExecScheduler

        return ExecScheduler(o.hooks, timeout_s=o.timeout_s, env={str(k): str(x) for k, x in o.env.items()})
    from controller.heal.scheduler.sim import SimScheduler

    nodes = list(o.nodes) or (fabric.nodes() if fabric is not None else [])
    return SimScheduler(nodes, reason_prefix=o.reason_prefix)


def check_references(st: ControllerSettings, *, reach: bool = False) -> list[str]:
    """What `config check` adds to the settings' own checks: the files they name load; with ``reach``,
    the etcd endpoints they name answer. One line per problem, naming the setting."""
    c = st.controller
    paths = {
        "fabric.path": c.fabric_path,
        "detection.rules_path": c.rules_path,
        "heal.policy_path": c.heal.policy_path if c.heal is not None else None,
    }
    problems = [line for key, path in paths.items() if path is not None for line in _file_problems(key, path)]
    if reach and c.ha is not None:
        problems.extend(f"ha.etcd: {line}" for line in _unreachable(c.ha.etcd))
    return problems


def _file_problems(key: str, path: Path) -> list[str]:
    """Why the file ``key`` names does not load (fabric, rules or policy), one line each; [] when it does."""
    from controller.detect.rules import load_rules
    from controller.heal.policy import load_policy
    from starpulse.core.schema import ConfigError

    loaders: dict[str, Any] = {
        "fabric.path": load_fabric,
        "detection.rules_path": load_rules,
        "heal.policy_path": load_policy,
    }
    try:
        loaders[key](path)
    except ConfigError as exc:
        return [f"{key}: {line}" for line in exc.errors]
    return []


def check_raw_references(raw: Mapping[str, Any], base_dir: Path, errors: list[str]) -> list[str]:
    """The referenced files' problems when the settings themselves have errors (no ControllerSettings to
    read them from): the paths as the file writes them, so one `config check` run reports both."""
    problems = []
    for key in ("fabric.path", "detection.rules_path", "heal.policy_path"):
        if any(f"{key}:" in line for line in errors):
            continue  # the setting itself is wrong: said already
        section, _, leaf = key.partition(".")
        value = raw.get(key, raw.get(section, {}).get(leaf) if isinstance(raw.get(section), dict) else None)
        if isinstance(value, str) and value:
            path = Path(value) if Path(value).is_absolute() else base_dir / value
            problems.extend(_file_problems(key, path))
    return problems


def _unreachable(endpoints: list[str], timeout_s: float = 2.0) -> list[str]:
    """The endpoints no TCP connection reaches within timeout_s (etcd's own health needs a client)."""
    import socket

    out = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as exc:
            out.append(f"{endpoint}: unreachable ({exc.strerror or exc})")
    return out


def summary(st: ControllerSettings) -> str:
    """One line for `starpulse config check`."""
    c, h = st.controller, st.settings.heal
    heal = f"{h.scheduler.type}/{h.guards.mode}" if h is not None else "off"
    return (
        f"controller: grpc {c.listen}, http {c.http}, db {c.db_path}, heartbeat {c.heartbeat_timeout_s:g}s, "
        f"{len(c.notify.receivers)} receiver(s), heal {heal}, tls {'on' if st.tls else 'off'}"
    )
