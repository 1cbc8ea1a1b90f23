"""Service configuration files: one YAML (or TOML) file per service, checked against a schema.

A file holds sections (``server``, ``ingest``, … for the controller; ``agent``, ``hardware``,
… for the agent). Every setting has a type, a default, a unit in its name (``_s`` seconds,
``_bytes``, ``_per_s``) and, where it matters, a range or a set of allowed values. Loading
reports every problem at once, each naming where the value came from and the dotted key::

    deploy/controller.yaml: ingest.heartbeat_timeout_s: must be a number > 0, got 'soon'

Precedence, lowest first: schema defaults, the file, environment overrides, then explicit
command-line flags (passed as ``overrides``). Environment overrides are named
``STARPULSE_<SECTION>__<KEY>`` with a double underscore between nesting levels, e.g.
``STARPULSE_INGEST__HEARTBEAT_TIMEOUT_S=30`` or ``STARPULSE_HEAL__GUARDS__MODE=dry_run``.
Their values are parsed as YAML scalars (lists may also be comma-separated) and checked
like file values; a bad one is reported under the variable's name. Variables whose first
part is not a section of this service are ignored (an agent and a controller may share an
environment).

Relative paths in a file are resolved against the file's folder; relative paths from the
environment or flags against the working directory.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "STARPULSE_"
KINDS = ("controller", "agent")


class ConfigError(ValueError):
    """A configuration that cannot be used; ``errors`` holds every problem, one line each."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# -- schema ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One typed setting.

    kind: str, path, address (HOST:PORT), int, float, bool, enum, list (of strings; items
    from ``choices`` when given, HOST:PORT when ``item_address``), map (free-form mapping,
    checked by its consumer), list_map (name -> list of strings).
    """

    kind: str
    default: Any = None
    doc: str = ""
    required: bool = False
    nullable: bool = False
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    item_address: bool = False
    nonempty: bool = False

    def expect(self) -> str:
        """What a valid value looks like, for error messages."""
        bounds = [f"{op} {_num(v)}" for op, v in ((">", self.gt), (">=", self.ge), ("<=", self.le)) if v is not None]
        rng = (" " + " and ".join(bounds)) if bounds else ""
        base = {
            "str": "a non-empty string" if self.nonempty else "a string",
            "path": "a path",
            "address": "HOST:PORT",
            "int": "an integer" + rng,
            "float": "a number" + rng,
            "bool": "true or false",
            "enum": "one of " + ", ".join(self.choices),
            "map": "a mapping",
            "list_map": "a mapping of names to lists of strings",
        }.get(self.kind)
        if base is None:  # list
            if self.choices:
                base = "a list with items from " + ", ".join(self.choices)
            else:
                base = "a list of HOST:PORT" if self.item_address else "a list of strings"
            if self.nonempty:
                base = "a non-empty " + base[2:]
        return base + (", or null" if self.nullable else "")


Schema = dict[str, "Setting | Schema"]


def _num(v: float) -> str:
    return f"{v:g}"


def _s(kind: str, default: Any = None, doc: str = "", **kw: Any) -> Setting:
    return Setting(kind, default, doc, **kw)


_SIGNALS = ("sm_clock_mhz", "power_w", "gpu_util_pct", "nic_gbps", "step_time_s")  # failslow.SIGNALS

TLS_SCHEMA: Schema = {
    "ca_file": _s("path", None, "CA (PEM) that signs every agent and controller certificate", nullable=True),
    "cert_file": _s("path", None, "this service's certificate (PEM)", nullable=True),
    "key_file": _s("path", None, "this service's private key (PEM)", nullable=True),
}
LOG_SCHEMA: Schema = {
    "level": _s("enum", "info", "log threshold", choices=("debug", "info", "warning", "error")),
    "format": _s(
        "enum", "json", "json: one object a line (journald, shippers); console: for people", choices=("json", "console")
    ),
}

CONTROLLER_SCHEMA: Schema = {
    "server": {
        "listen": _s("address", "127.0.0.1:50051", "gRPC address for agents and the CLI"),
        "http": _s("address", "127.0.0.1:8080", "HTTP address: /metrics, /healthz, /api, dashboard"),
        "db_path": _s("path", "starpulse.db", "SQLite database"),
        "controller_id": _s("str", "controller-0", "this controller's name in acks and logs", nonempty=True),
        "grace_s": _s("float", 5.0, "on shutdown, let open streams end this long", ge=0),
        "extra_listen": _s("list", [], "more gRPC addresses to listen on", item_address=True),
    },
    "ingest": {
        "heartbeat_timeout_s": _s("float", 15.0, "a node silent this long is unreachable", gt=0),
        "sweep_interval_s": _s("float", 1.0, "heartbeat sweep and detection tick cadence", gt=0),
        "max_message_bytes": _s("int", 4 * 1024 * 1024, "larger agent messages are refused", ge=1024),
        "rate_per_node_per_s": _s("float", 200.0, "sustained messages a node may send per second", gt=0),
        "rate_burst": _s("float", 5000.0, "messages a node may send at once (replay after an outage)", ge=1),
        "report_interval_s": _s("float", 0.0, "interval agents are told to report at; 0: their own", ge=0),
        "report_ack_interval_s": _s(
            "float", 10.0, "report-only acks at most this often per stream (events: at once)", ge=0
        ),
        "relays": _s("list", [], "relay ids allowed to carry agents' streams with mTLS (their certificates' names)"),
    },
    "fabric": {
        "path": _s("path", None, "declared fabric (JSON/YAML from `starpulse topology generate`)", nullable=True),
        "allowed_nodes": _s(
            "list", None, "node ids that may register; null: any valid id (or the fabric's)", nullable=True
        ),
        "jobs": _s("list_map", {}, "static job -> nodes placement, until a job registry reports it"),
    },
    "detection": {
        "rules_path": _s("path", None, "detection rules file; null: the packaged rules", nullable=True),
        "failslow_every_s": _s("float", 5.0, "fail-slow peer comparison cadence", gt=0),
        "workers": _s(
            "int",
            0,
            "processes that evaluate compute nodes' reports (detection shards); "
            "0: in the controller (up to ~4,000-6,000 nodes at 5 s)",
            ge=0,
            le=64,
        ),
        "correlation": {
            "settle_s": _s("float", 2.0, "wait after a new condition before grouping", ge=0),
            "min_nodes_for_switch": _s("int", 2, "nodes failing on one leaf that blame the leaf", ge=1),
            "min_leaves_for_spine": _s("int", 2, "leaves failing towards one spine that blame the spine", ge=1),
            "node_device_threshold": _s("int", 3, "devices of one node failing that make a node fault", ge=1),
            "partition_min_nodes": _s("int", 3, "lost heartbeats behind one switch that make a partition", ge=1),
            "partition_fleet_share": _s(
                "float", 0.2, "lost heartbeats above this fleet share make a partition", gt=0, le=1
            ),
            "resolve_hold_s": _s("float", 60.0, "conditions must stay resolved this long (flap damping)", ge=0),
            "restart_grace_s": _s("float", 300.0, "after a restart, resumed incidents wait this long", ge=0),
        },
        "failslow": {
            "window_s": _s("float", 300.0, "samples a node's value is the median of", gt=0),
            "min_samples": _s("int", 5, "samples a node needs in the window to be compared", ge=1),
            "z_threshold": _s("float", 3.5, "robust z-score a node must reach", gt=0),
            "min_relative_deviation": _s("float", 0.1, "fraction of the group median the gap must reach", ge=0),
            "persist_evaluations": _s("int", 3, "consecutive deviating evaluations before flagging", ge=1),
            "min_group_size": _s("int", 4, "nodes a group needs before anyone in it is compared", ge=2),
            "signals": _s("list", list(_SIGNALS), "signals to compare", choices=_SIGNALS),
            "job_ttl_s": _s(
                "float", None, "a node stays in its last job this long; null: window_s", gt=0, nullable=True
            ),
            "sample_every_s": _s(
                "float", 15.0, "a node's signals come from one report per this period; 0: every one", ge=0
            ),
        },
    },
    "notify": _s("map", {}, "alert receivers (see docs/alerts.md); checked by the notify parser"),
    "heal": {
        "enabled": _s("bool", False, "act on incidents through a scheduler (false: detect and alert only)"),
        "policy_path": _s("path", None, "remediation policy; null: the packaged default policy", nullable=True),
        "checkpoint_timeout_s": _s("float", 30.0, "wait for a requested checkpoint before evicting anyway", ge=0),
        "action_retries": _s("int", 5, "retries of a temporarily failing scheduler action", ge=0),
        "retry_delay_s": _s("float", 2.0, "delay between those retries", ge=0),
        "guards": {
            "mode": _s(
                "enum",
                "enforce",
                "enforce: act; dry_run: only log; manual: act on approval",
                choices=("enforce", "dry_run", "manual"),
            ),
            "max_evictions_per_window": _s("int", 2, "distinct nodes evicted per window_s", ge=0),
            "window_s": _s("float", 600.0, "sliding window of the eviction budget", gt=0),
            "max_fleet_share": _s("float", 0.05, "fleet share automation may hold out of service", ge=0, le=1),
            "breaker_trip_share": _s("float", 0.5, "faulty fleet share that opens the breaker", gt=0, le=1),
            "breaker_window_s": _s("float", 300.0, "how far back incidents count towards the breaker", gt=0),
            "breaker_trip_incidents": _s("int", 0, "incidents in the window that open the breaker; 0: off", ge=0),
            "breaker_min_nodes": _s("int", 2, "never trip on fewer faulty nodes", ge=1),
            "cooldown_s": _s("float", 1800.0, "no new action on a node this long after its last", ge=0),
            "flap_window_s": _s("float", 3600.0, "window of flap protection", gt=0),
            "flap_max": _s("int", 3, "returns to healthy within flap_window_s before a node is held", ge=1),
        },
        "scheduler": {
            "type": _s("enum", "slurm", "which scheduler acts", choices=("slurm", "kubernetes", "exec", "sim")),
            "slurm": {
                "conf_path": _s(
                    "path", None, "SLURM_CONF for the client commands; null: Slurm's default", nullable=True
                ),
                "bin_dir": _s("path", None, "folder of scontrol/sinfo/squeue/scancel; null: PATH", nullable=True),
                "timeout_s": _s("float", 30.0, "per-command timeout", gt=0),
                "reason_prefix": _s("str", "starpulse:", "drain reasons starting with this are ours", nonempty=True),
                "requeue_settle_s": _s("float", 1.1, "wait after a requeue before checking it", ge=0),
                "requeue_end_timeout_s": _s("float", 60.0, "wait this long for a requeued job to end", gt=0),
                "start_wait_s": _s("float", 10.0, "wait this long for a requeued job to start", ge=0),
                "signal_scope": _s(
                    "enum", "full", "which job steps a checkpoint signal reaches", choices=("full", "batch")
                ),
                "poll_s": _s("float", 0.2, "polling interval while waiting", gt=0),
            },
            "kubernetes": {
                "config_file": _s(
                    "path", None, "kubeconfig when not in a cluster; null: in-cluster or ~/.kube", nullable=True
                ),
                "noexecute_on_drain": _s("bool", False, "also taint NoExecute when draining"),
                "grace_period_s": _s(
                    "int", None, "pod eviction grace period; null: the pod's own", ge=0, nullable=True
                ),
                "request_timeout_s": _s("float", 30.0, "per API request timeout", gt=0),
            },
            "exec": {
                "hooks": _s(
                    "list_map",
                    {},
                    "action -> argv (cordon, drain, resume, requeue, signal_job, node_status, job_nodes, list_nodes)",
                ),
                "timeout_s": _s("float", 60.0, "per-hook timeout", gt=0),
                "env": _s("map", {}, "extra environment for the hooks (name -> value)"),
            },
            "sim": {
                "nodes": _s("list", [], "simulated nodes; empty: the fabric's nodes"),
                "reason_prefix": _s("str", "starpulse:", "drain reasons starting with this are ours", nonempty=True),
            },
        },
    },
    "ha": {
        "enabled": _s(
            "bool",
            False,
            "run as one of several replicas, leader elected through etcd (false: one controller on SQLite)",
        ),
        "etcd": _s(
            "list", ["127.0.0.1:2379"], "etcd client addresses, tried in order", item_address=True, nonempty=True
        ),
        "prefix": _s("str", "/starpulse", "etcd key prefix", nonempty=True),
        "cluster": _s("str", "default", "this installation's name under the prefix", nonempty=True),
        "lease_ttl_s": _s("int", 5, "leader lease: a dead leader is replaced within this", ge=2, le=60),
        "advertise": _s("str", "", "gRPC HOST:PORT standbys send agents to; empty: server.listen"),
        "flush_interval_s": _s("float", 0.05, "the leader pushes changed state to etcd this often", gt=0),
        "event_retention_s": _s("float", 7 * 86400.0, "events stay in etcd this long; 0: forever", ge=0),
        "poll_interval_s": _s("float", 0.2, "a standby looks for a vacant leader key this often", gt=0),
        "etcd_timeout_s": _s("float", 5.0, "per etcd request", gt=0),
    },
    "tls": TLS_SCHEMA,
    "auth": {
        "admin_token_file": _s("path", None, "file holding the admin API bearer token; null: no token", nullable=True),
        "open_reads": _s("bool", True, "read-only API calls need no credentials"),
        "admin_cert_names": _s("list", [], "mTLS certificate names that count as admin"),
    },
    "log": LOG_SCHEMA,
}

AGENT_SCHEMA: Schema = {
    "agent": {
        "node_id": _s("str", None, "this node's id (letters, digits, . _ -)", required=True),
        "role": _s("enum", "compute", "compute: a GPU node; switch: a SONiC switch", choices=("compute", "switch")),
        "controllers": _s(
            "list", None, "controller addresses, tried in order", required=True, item_address=True, nonempty=True
        ),
        "interval_s": _s("float", 5.0, "report interval", gt=0),
        "state_dir": _s("path", "/var/lib/starpulse", "event buffer (and sim hardware) folder"),
        "buffer_max_events": _s("int", 100_000, "events kept on disk while the controller is away", ge=1),
        "storm_window_s": _s("float", 60.0, "window of event-storm suppression", gt=0),
        "storm_burst": _s("int", 5, "identical events per window before suppression", ge=1),
        "flush_timeout_s": _s("float", 2.0, "on shutdown, wait this long for acks of buffered events", ge=0),
        "boot_id_path": _s("path", "/proc/sys/kernel/random/boot_id", "a new boot id restarts kernel-log seqs"),
        "counters_every_s": _s(
            "float", 5.0, "full reads of slow counters (NIC/NVLink errors) at most this often; 0: every cycle", ge=0
        ),
    },
    "hardware": {
        "backend": _s("enum", "nvml", "nvml: real GPUs; sim: simulated hardware", choices=("nvml", "sim")),
        "sysfs_root": _s("path", "/sys", "sysfs (RDMA, NIC, PCI)"),
        "kmsg": _s("str", "/dev/kmsg", "kernel log to tail; null or empty: off", nullable=True),
        "mounts": _s("list", ["/"], "mount points whose disk usage to report"),
        "ethtool": _s("bool", True, "collect NIC counters with ethtool"),
        "seed": _s("int", 0, "sim backend: seed of the simulated hardware", ge=0),
        "redis": _s("address", None, "role switch: SONiC Redis; null: its default socket", nullable=True),
        "lldpcli_socket": _s(
            "path",
            None,
            "lldpd control socket to read neighbours from (lldpcli -u); null: lldpd's default",
            nullable=True,
        ),
        "lldp_interval_s": _s("float", 30.0, "read LLDP neighbours at most this often", gt=0),
        "sim_gpus": _s("int", 8, "sim backend: GPUs of the simulated node", ge=1, le=32),
        "sim_nics": _s("int", 8, "sim backend: rail NICs of the simulated node", ge=0, le=28),
        "sim_real_netdevs": _s(
            "bool", False, "sim backend: rail netdevs that exist here are real; port state follows their carrier"
        ),
    },
    "jobs": {
        "socket": _s("path", None, "unix socket for training jobs (starpulse.job); null: off", nullable=True),
        "allowed_commands": _s(
            "list_map",
            {},
            "commands the controller may run here: gpu_reset, reboot, run_diagnostic -> argv ({gpu}: a GPU index)",
        ),
    },
    "metrics": {
        "listen": _s("address", None, "serve Prometheus /metrics here; null: off", nullable=True),
    },
    "tls": TLS_SCHEMA,
    "log": LOG_SCHEMA,
}

SCHEMAS: dict[str, Schema] = {"controller": CONTROLLER_SCHEMA, "agent": AGENT_SCHEMA}


def iter_settings(schema: Schema, prefix: str = "") -> Iterator[tuple[str, Setting]]:
    """Every (dotted key, Setting) of a schema, depth first in declaration order."""
    for name, node in schema.items():
        key = f"{prefix}{name}"
        if isinstance(node, Setting):
            yield key, node
        else:
            yield from iter_settings(node, key + ".")


# -- settings objects -------------------------------------------------------------------------
@dataclass(frozen=True)
class AuthSettings:
    """Admin API authentication (mirrors starpulse.core.auth's AuthConfig while that lands)."""

    admin_token_file: Path | None = None
    open_reads: bool = True
    admin_cert_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogSettings:
    level: str = "info"
    format: str = "json"


@dataclass
class ControllerSettings:
    """What a controller file yields: the service config plus process-level settings."""

    controller: Any  # controller.service.ControllerConfig
    tls: Any = None  # starpulse.core.tls.TLSSettings | None
    auth: AuthSettings = field(default_factory=AuthSettings)
    log: LogSettings = field(default_factory=LogSettings)
    values: dict[str, Any] = field(default_factory=dict)  # the checked values, by section


@dataclass
class AgentOptions:
    """Agent settings that are not AgentConfig fields: how collectors are built and run."""

    role: str = "compute"
    backend: str = "nvml"
    state_dir: Path = Path("/var/lib/starpulse")
    sysfs_root: str = "/sys"
    kmsg: str | None = "/dev/kmsg"
    mounts: list[str] = field(default_factory=lambda: ["/"])
    ethtool: bool = True
    seed: int = 0
    redis: str | None = None
    lldpcli_socket: str | None = None
    lldp_interval_s: float = 30.0
    sim_gpus: int = 8
    sim_nics: int = 8
    sim_real_netdevs: bool = False
    tls: Any = None  # starpulse.core.tls.TLSSettings | None
    log: LogSettings = field(default_factory=LogSettings)


# -- reading and merging ----------------------------------------------------------------------
Override = tuple[str, Any]  # (where it came from, e.g. "--listen"; value)


@dataclass
class _Doc:
    """A raw tree being checked, with where each value came from."""

    name: str  # the file, for values from it and for missing keys
    raw: dict[str, Any]
    origin: dict[str, str] = field(default_factory=dict)  # dotted key -> env var or flag
    errors: list[str] = field(default_factory=list)
    base_dir: Path | None = None

    def err(self, key: str, msg: str) -> None:
        where = self.origin.get(key) or next(
            (o for k, o in self.origin.items() if key.startswith(k + ".") or key.startswith(k + "[")), self.name
        )
        self.errors.append(f"{where}: {key}: {msg}" if key else f"{where}: {msg}")


def read_file(path: str | Path) -> dict[str, Any]:
    """Parse a YAML or TOML (by suffix) config file into a mapping; ConfigError otherwise."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"{name}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        data = tomllib.loads(text) if name.endswith(".toml") else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError([f"{name}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{name}: not valid TOML: {exc}"]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{name}: must be a mapping of sections, got {_show(data)}"])
    return data


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _env_value(setting: Setting, text: str) -> Any:
    """An environment string as the setting's type would read it from YAML."""
    if setting.nullable and text.strip() in ("", "null", "~"):
        return None
    if setting.kind in ("str", "path", "address", "enum"):
        return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if setting.kind == "list" and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _set(raw: dict[str, Any], path: list[str], value: Any) -> None:
    node = raw
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def _apply_env(doc: _Doc, schema: Schema, env: Mapping[str, str]) -> None:
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or "__" not in var:
            continue
        parts = var[len(ENV_PREFIX) :].lower().split("__")
        if parts[0] not in schema:
            continue  # another service's section
        node: Setting | Schema = schema
        for i, part in enumerate(parts):
            if isinstance(node, Setting):
                if node.kind not in ("map", "list_map"):
                    doc.errors.append(f"{var}: {'.'.join(parts[:i])} is a setting, not a section")
                    break
                value = yaml.safe_load(env[var]) if env[var].strip() else ""
                _set(doc.raw, parts, value)
                doc.origin[".".join(parts)] = var
                break
            if part not in node:
                doc.errors.append(f"{var}: unknown setting {'.'.join(parts[: i + 1])}{_did_you_mean(part, node)}")
                break
            node = node[part]
        else:
            if isinstance(node, Setting):
                _set(doc.raw, parts, _env_value(node, env[var]))
                doc.origin[".".join(parts)] = var
            else:
                doc.errors.append(f"{var}: {'.'.join(parts)} is a section, not a setting")


def _apply_overrides(doc: _Doc, schema: Schema, overrides: Mapping[str, Override]) -> None:
    for key, (source, value) in overrides.items():
        path = key.split(".")
        node: Setting | Schema = schema
        for part in path:
            if isinstance(node, Setting) or part not in node:
                raise KeyError(f"override {key!r} is not a setting")
            node = node[part]
        _set(doc.raw, path, value)
        doc.origin[key] = source


def _did_you_mean(name: str, options: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f", did you mean {close[0]!r}?" if close else ""


# -- checking -------------------------------------------------------------------------------
def _address_ok(value: str) -> bool:
    if value.startswith("unix:"):
        return len(value) > 5
    host, _, port = value.rpartition(":")
    return bool(host.strip("[]")) and port.isdigit() and 0 <= int(port) <= 65535


def _check_value(doc: _Doc, key: str, s: Setting, value: Any) -> Any:
    """The checked value (paths as Path), or the default after recording an error."""
    if value is None:
        if s.nullable:
            return None
        doc.err(key, f"must be {s.expect()}, got null")
        return s.default
    bad = False
    k = s.kind
    if k in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float) or (k == "int" and not isinstance(value, int)):
            bad = True
        else:
            bad = (
                (s.gt is not None and not value > s.gt)
                or (s.ge is not None and not value >= s.ge)
                or (s.le is not None and not value <= s.le)
            )
    elif k == "bool":
        bad = not isinstance(value, bool)
    elif k in ("str", "path"):
        bad = not isinstance(value, str) or (s.nonempty and not value.strip()) or (k == "path" and not value)
    elif k == "address":
        bad = not isinstance(value, str) or not _address_ok(value)
    elif k == "enum":
        bad = value not in s.choices
    elif k == "list":
        bad = (
            not isinstance(value, list)
            or not all(isinstance(v, str) and v for v in value)
            or (s.nonempty and not value)
            or (bool(s.choices) and any(v not in s.choices for v in value))
            or (s.item_address and not all(_address_ok(v) for v in value))
        )
    elif k == "map":
        bad = not isinstance(value, dict)
    elif k == "list_map":
        bad = not isinstance(value, dict) or not all(
            isinstance(n, str) and isinstance(v, list) and v and all(isinstance(a, str) and a for a in v)
            for n, v in value.items()
        )
    if bad:
        doc.err(key, f"must be {s.expect()}, got {_show(value)}")
        return s.default
    if k == "path":
        return _resolve(doc, key, value)
    return float(value) if k == "float" else value


def _resolve(doc: _Doc, key: str, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and doc.base_dir is not None and key not in doc.origin:
        path = doc.base_dir / path
    return path


def _check(doc: _Doc, schema: Schema, raw: Any, prefix: str = "") -> dict[str, Any]:
    """Checked values for a (sub)section: defaults filled, every error recorded."""
    out: dict[str, Any] = {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        doc.err(prefix.rstrip("."), f"must be a mapping, got {_show(raw)}")
        raw = {}
    for name in raw:
        if name not in schema:
            doc.err(f"{prefix}{name}", f"unknown key{_did_you_mean(str(name), schema)}")
    for name, node in schema.items():
        key = f"{prefix}{name}"
        if isinstance(node, Setting):
            if name in raw:
                out[name] = _check_value(doc, key, node, raw[name])
            elif node.required:
                doc.err(key, "is required")
                out[name] = node.default
            else:
                out[name] = Path(node.default) if node.kind == "path" and node.default is not None else node.default
        else:
            out[name] = _check(doc, node, raw.get(name), key + ".")
    return out


def _load(
    kind: str,
    path: str | Path | None,
    env: Mapping[str, str] | None,
    overrides: Mapping[str, Override] | None,
) -> tuple[_Doc, dict[str, Any]]:
    schema = SCHEMAS[kind]
    raw = read_file(path) if path is not None else {}
    doc = _Doc(
        str(path) if path is not None else f"<{kind} defaults>",
        raw,
        base_dir=Path(path).parent if path is not None else None,
    )
    _apply_env(doc, schema, os.environ if env is None else env)
    _apply_overrides(doc, schema, overrides or {})
    values = _check(doc, schema, doc.raw)
    tls = values["tls"]
    given = [k for k in ("ca_file", "cert_file", "key_file") if tls[k] is not None]
    if given and len(given) != 3:
        missing = [k for k in ("ca_file", "cert_file", "key_file") if tls[k] is None]
        doc.err("tls", f"set all of ca_file, cert_file and key_file or none; missing {', '.join(missing)}")
    return doc, values


def _tls(values: dict[str, Any]) -> Any:
    from starpulse.core.tls import TLSSettings

    t = values["tls"]
    return TLSSettings(t["ca_file"], t["cert_file"], t["key_file"]) if t["ca_file"] is not None else None


def _log(values: dict[str, Any]) -> LogSettings:
    return LogSettings(values["log"]["level"], values["log"]["format"])


# -- controller -----------------------------------------------------------------------------
# Complexity over 15 on purpose: a hand mapping of file sections to settings; replaced by the settings source (issue 16,
# settings slice).
def load_controller_settings(  # noqa: C901
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Override] | None = None,
    *,
    connect: bool = True,
) -> ControllerSettings:
    """Read, check and build a controller file; ConfigError lists every problem.

    ``overrides`` maps dotted keys to (source, value), e.g. explicit command-line flags;
    they win over the environment, which wins over the file. With ``connect=False`` the
    kubernetes scheduler is not constructed (it reads kubeconfig), as ``config check`` needs.
    """
    from controller.detect.correlate import CorrelationConfig
    from controller.detect.failslow import FailSlowConfig
    from controller.detect.pipeline import DetectionConfig
    from controller.heal.guards import GuardConfig
    from controller.heal.healer import HealConfig
    from controller.outputs.notify import NotifyConfigError, parse_notify_config
    from controller.service import ControllerConfig, HealSettings

    doc, v = _load("controller", path, env, overrides)
    for i, node in enumerate(v["fabric"]["allowed_nodes"] or []):
        _node_id(doc, f"fabric.allowed_nodes[{i}]", node)
    for job, nodes in v["fabric"]["jobs"].items():
        for i, node in enumerate(nodes):
            _node_id(doc, f"fabric.jobs.{job}[{i}]", node)
    notify = None
    try:
        base = doc.base_dir if "notify" not in doc.origin else None
        notify = parse_notify_config(v["notify"], "\0", base_dir=base)
    except NotifyConfigError as exc:
        key, sep, rest = str(exc).removeprefix("\0: ").partition(": ")
        if sep:
            doc.err(f"notify.{key}", rest)
        else:
            doc.err("notify", key)
    det = v["detection"]
    correlation = failslow = None
    try:
        correlation = CorrelationConfig(**det["correlation"])
    except ValueError as exc:
        doc.err("detection.correlation", str(exc))
    try:
        fs = dict(det["failslow"])
        fs["signals"] = tuple(fs["signals"])
        failslow = FailSlowConfig(**fs)
    except ValueError as exc:
        doc.err("detection.failslow", str(exc))
    auth = AuthSettings(v["auth"]["admin_token_file"], v["auth"]["open_reads"], tuple(v["auth"]["admin_cert_names"]))
    auth_config: Any = auth
    try:
        auth_config = _auth_config(auth)
    except ValueError as exc:
        doc.err("auth", str(exc))
    fabric_path = v["fabric"]["path"]
    fabric = None
    h = v["heal"]
    heal = None
    if h["enabled"]:
        stype = h["scheduler"]["type"]
        opts = h["scheduler"][stype]
        if stype == "sim" and not opts["nodes"] and fabric_path is None:
            doc.err("heal.scheduler.sim.nodes", "is required when fabric.path is not set")
        else:
            try:
                if stype == "sim" and not opts["nodes"] and fabric_path is not None:
                    from controller.fabric import load_fabric

                    fabric = load_fabric(fabric_path)
                scheduler = _scheduler(stype, opts, fabric, connect)
            except (OSError, ValueError) as exc:
                doc.err(f"heal.scheduler.{stype}", str(exc))
                scheduler = None
            guards = GuardConfig(**h["guards"])
            if scheduler is not None and not doc.errors:
                heal = HealSettings(
                    scheduler=scheduler,
                    policy_path=h["policy_path"],
                    guards=guards,
                    heal=HealConfig(h["checkpoint_timeout_s"], h["action_retries"], h["retry_delay_s"]),
                )
    ha = _ha(doc, v["ha"])
    if doc.errors:
        raise ConfigError(doc.errors)
    assert correlation is not None and failslow is not None and notify is not None
    s, ing = v["server"], v["ingest"]
    cfg = ControllerConfig(
        listen=s["listen"],
        http=s["http"],
        db_path=s["db_path"],
        controller_id=s["controller_id"],
        grace_s=s["grace_s"],
        extra_listen=list(s["extra_listen"]),
        heartbeat_timeout_s=ing["heartbeat_timeout_s"],
        sweep_interval_s=ing["sweep_interval_s"],
        max_message_bytes=ing["max_message_bytes"],
        rate_per_node_per_s=ing["rate_per_node_per_s"],
        rate_burst=ing["rate_burst"],
        report_interval_s=ing["report_interval_s"],
        report_ack_interval_s=ing["report_ack_interval_s"],
        relays=list(ing["relays"]),
        allowed_nodes=v["fabric"]["allowed_nodes"],
        fabric=fabric,
        fabric_path=fabric_path if fabric is None else None,
        rules_path=det["rules_path"],
        jobs={k: list(n) for k, n in v["fabric"]["jobs"].items()},
        detection=DetectionConfig(correlation, failslow, det["failslow_every_s"], det["workers"]),
        notify=notify,
        heal=heal,
        ha=ha,
    )
    tls = _tls(v)
    names = {f.name for f in fields(ControllerConfig)}
    if "tls" in names:  # the mTLS work adds these; set them when the service has them
        setattr(cfg, "tls", tls)  # noqa: B010
    if "auth" in names:
        setattr(cfg, "auth", auth_config)  # noqa: B010
    return ControllerSettings(cfg, tls, auth, _log(v), v)


def _ha(doc: _Doc, h: dict[str, Any]) -> Any:
    """The HAConfig of the ``ha`` section (None unless enabled)."""
    from controller.ha.config import HAConfig

    if not h["enabled"]:
        return None
    if h["advertise"] and not _address_ok(h["advertise"]):
        doc.err("ha.advertise", f"must be HOST:PORT or empty, got {h['advertise']!r}")
        return None
    try:
        options: dict[str, Any] = {k: x for k, x in h.items() if k != "enabled"}
        return HAConfig(**{**options, "etcd": list(h["etcd"])})
    except ValueError as exc:
        doc.err("ha", str(exc))
        return None


def _auth_config(auth: AuthSettings) -> Any:
    """starpulse.core.auth.AuthConfig (tokens read from the file) when that module exists, else ``auth``."""
    import importlib

    try:
        mod = importlib.import_module("starpulse.core.auth")
    except ImportError:
        return auth
    tokens = mod.load_tokens(auth.admin_token_file) if auth.admin_token_file is not None else None
    return mod.AuthConfig(admin_tokens=tokens, open_reads=auth.open_reads, admin_cert_names=list(auth.admin_cert_names))


def load_controller_config(
    path: str | Path, env: Mapping[str, str] | None = None, overrides: Mapping[str, Override] | None = None
) -> Any:
    """The ControllerConfig of a controller file (see load_controller_settings)."""
    return load_controller_settings(path, env, overrides).controller


def _scheduler(stype: str, o: dict[str, Any], fabric: Any, connect: bool) -> Any:
    if stype == "slurm":
        from controller.heal.scheduler.slurm import SlurmScheduler

        return SlurmScheduler(**o)
    if stype == "kubernetes":
        if not connect:
            return None
        from controller.heal.scheduler.kubernetes import KubernetesScheduler

        return KubernetesScheduler(**o)
    if stype == "exec":
        from controller.heal.scheduler.exec import ExecScheduler

        return ExecScheduler(o["hooks"], timeout_s=o["timeout_s"], env={str(k): str(x) for k, x in o["env"].items()})
    from controller.heal.scheduler.sim import SimScheduler

    return SimScheduler(list(o["nodes"]) or fabric.nodes(), reason_prefix=o["reason_prefix"])


def _node_id(doc: _Doc, key: str, node: str) -> None:
    from starpulse.core.names import InvalidName, validate_node_id

    try:
        validate_node_id(node)
    except InvalidName as exc:
        doc.err(key, str(exc))


# -- agent ----------------------------------------------------------------------------------
def load_agent_config(
    path: str | Path | None, env: Mapping[str, str] | None = None, overrides: Mapping[str, Override] | None = None
) -> tuple[Any, AgentOptions]:
    """(AgentConfig, AgentOptions) of an agent file; ConfigError lists every problem."""
    from agent.commands import CommandHandler
    from agent.runtime import AgentConfig
    from starpulse.v1 import inventory_pb2 as ipb

    doc, v = _load("agent", path, env, overrides)
    a, hw, jobs = v["agent"], v["hardware"], v["jobs"]
    if a["node_id"] is not None:
        _node_id(doc, "agent.node_id", a["node_id"])
    try:
        CommandHandler(None, jobs["allowed_commands"])
    except ValueError as exc:
        doc.err("jobs.allowed_commands", str(exc))
    if doc.errors:
        raise ConfigError(doc.errors)
    role = {"compute": ipb.NODE_ROLE_COMPUTE, "switch": ipb.NODE_ROLE_SWITCH}[a["role"]]
    config = AgentConfig(
        node_id=a["node_id"],
        controllers=list(a["controllers"]),
        role=role,
        interval_s=a["interval_s"],
        buffer_path=str(a["state_dir"] / "agent-buffer.db"),
        buffer_max_events=a["buffer_max_events"],
        storm_window_s=a["storm_window_s"],
        storm_burst=a["storm_burst"],
        boot_id_path=str(a["boot_id_path"]),
        flush_timeout_s=a["flush_timeout_s"],
        counters_every_s=a["counters_every_s"],
        metrics_listen=v["metrics"]["listen"],
        job_socket=str(jobs["socket"]) if jobs["socket"] is not None else None,
        allowed_commands={k: list(x) for k, x in jobs["allowed_commands"].items()},
    )
    if "tls" in {f.name for f in fields(AgentConfig)}:  # the mTLS work adds it; set it when the agent has it
        setattr(config, "tls", _tls(v))  # noqa: B010
    options = AgentOptions(
        role=a["role"],
        backend=hw["backend"],
        state_dir=a["state_dir"],
        sysfs_root=str(hw["sysfs_root"]),
        kmsg=hw["kmsg"] or None,
        mounts=list(hw["mounts"]),
        ethtool=hw["ethtool"],
        seed=hw["seed"],
        redis=hw["redis"],
        lldpcli_socket=str(hw["lldpcli_socket"]) if hw["lldpcli_socket"] is not None else None,
        lldp_interval_s=hw["lldp_interval_s"],
        sim_gpus=hw["sim_gpus"],
        sim_nics=hw["sim_nics"],
        sim_real_netdevs=hw["sim_real_netdevs"],
        tls=_tls(v),
        log=_log(v),
    )
    return config, options


# -- check ----------------------------------------------------------------------------------
def guess_kind(raw: Mapping[str, Any], path: str | Path) -> str:
    """controller or agent: by the sections present, else by the file name."""
    if "agent" in raw or "hardware" in raw:
        return "agent"
    if set(raw) & {"server", "ingest", "fabric", "detection", "notify", "heal", "auth"}:
        return "controller"
    return "agent" if "agent" in Path(path).name else "controller"


def check_file(path: str | Path, kind: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Check a file as `starpulse config check` does; the one-line summary, or ConfigError."""
    kind = kind or guess_kind(read_file(path), path)
    if kind == "agent":
        cfg, opt = load_agent_config(path, env)
        return (
            f"agent {cfg.node_id} ({opt.role}, {opt.backend}): controllers {','.join(cfg.controllers)}, "
            f"every {cfg.interval_s:g}s, state {opt.state_dir}, tls {'on' if opt.tls else 'off'}"
        )
    st = load_controller_settings(path, env, connect=False)
    c, h = st.controller, st.values["heal"]
    heal = f"{h['scheduler']['type']}/{h['guards']['mode']}" if h["enabled"] else "off"
    return (
        f"controller: grpc {c.listen}, http {c.http}, db {c.db_path}, heartbeat {c.heartbeat_timeout_s:g}s, "
        f"{len(c.notify.receivers)} receiver(s), heal {heal}, tls {'on' if st.tls else 'off'}"
    )
