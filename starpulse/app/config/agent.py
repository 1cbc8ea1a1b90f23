"""The agent's settings: its file's sections, its flags, and the one way to its AgentConfig."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.collectors.accel.registry import backend_names
from agent.commands import CONFIGURABLE, CommandHandler, is_configurable
from agent.runtime import AgentConfig
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
from starpulse.core.schema import Flag, Reading, Schema, default_of, from_field, gather, section, setting
from starpulse.core.tls import TLSSettings
from starpulse.v1 import inventory_pb2 as ipb

ROLES = {"compute": ipb.NODE_ROLE_COMPUTE, "switch": ipb.NODE_ROLE_SWITCH}
BUFFER_FILE = "agent-buffer.db"


# -- the file's sections ----------------------------------------------------------------------
@dataclass(kw_only=True)  # the required node_id and controllers around the role, in the file's order
class AgentSection:
    """This node, its controllers, and the agent's own loop and event buffer."""

    node_id: str = from_field(AgentConfig, "node_id")
    role: Literal["compute", "switch"] = setting(
        next(name for name, role in ROLES.items() if role == default_of(AgentConfig, "role")),
        "compute: a GPU node; switch: a SONiC switch (the agent reads the switch's Redis)",
    )
    controllers: list[str] = from_field(AgentConfig, "controllers")
    interval_s: float = from_field(AgentConfig, "interval_s")
    state_dir: Path = setting(
        Path(default_of(AgentConfig, "buffer_path")).parent,
        f"Folder of the event buffer ({BUFFER_FILE}) and of the sim backend's hardware",
    )
    buffer_max_events: int = from_field(AgentConfig, "buffer_max_events")
    storm_window_s: float = from_field(AgentConfig, "storm_window_s")
    storm_burst: int = from_field(AgentConfig, "storm_burst")
    flush_timeout_s: float = from_field(AgentConfig, "flush_timeout_s")
    boot_id_path: Path = from_field(AgentConfig, "boot_id_path", convert=Path)
    counters_every_s: float = from_field(AgentConfig, "counters_every_s")


@dataclass
class HardwareSection:
    """Where the agent reads its hardware: NVML or the simulator, sysfs, the kernel log, LLDP."""

    backend: str = setting(
        "nvml",
        "nvml: NVIDIA GPUs, amd: AMD Instinct (amdsmi), ascend: Huawei Ascend (npu-smi), or an installed "
        "accelerator plugin's name (without its driver or library: one clear line, never a fallback); "
        "sim: simulated hardware",
    )
    sysfs_root: Path = setting(Path("/sys"), "sysfs: RDMA, NIC and PCI devices")
    kmsg: str | None = setting("/dev/kmsg", "Kernel log to tail (the device, or a file); null or empty: off")
    mounts: list[str] = setting(["/"], "Mount points whose disk usage to report")
    ethtool: bool = setting(True, "Collect NIC counters with ethtool -S")
    seed: int = setting(0, "sim backend: seed of the simulated hardware", ge=0)
    redis: str | None = setting(None, "role switch: the SONiC switch's Redis; null: its own socket", address=True)
    lldpcli_socket: Path | None = setting(
        None, "lldpd control socket to read neighbours from (lldpcli -u); null: lldpd's own"
    )
    lldp_interval_s: float = setting(30.0, "Seconds: LLDP neighbours are read at most this often", gt=0)
    sim_gpus: int = setting(8, "sim backend: GPUs of the simulated node", ge=1, le=32)
    sim_nics: int = setting(8, "sim backend: rail NICs of the simulated node", ge=0, le=28)
    sim_real_netdevs: bool = setting(
        False,
        "sim backend: rail netdevs (ens1f0np0...) that exist on this host are real, each port's state "
        "follows its carrier (network-namespace tests)",
    )


@dataclass
class AcceleratorsSection:
    """The accelerators this node must show: a node that shows fewer is "not judged", never healthy."""

    expected_count: int | None = setting(
        None,
        "How many accelerators this node has (0: none, so a backend that finds none is fine); "
        "null: learned at first sight (see learn)",
        ge=0,
    )
    expected_vendor: str = setting("", "Whose they are (nvidia, amd, ascend, a plugin's); '': the backend's")
    learn: bool = setting(
        True,
        "Without expected_count: keep the count first seen in state_dir/accelerators.json and hold the node "
        "to it (a person confirms it with `starpulse accelerators confirm`)",
    )


@dataclass
class JobsSection:
    """Training jobs on this node (starpulse.job), and what the controller may run here."""

    socket: Path | None = from_field(AgentConfig, "job_socket")
    allowed_commands: dict[str, list[str]] = from_field(AgentConfig, "allowed_commands")


@dataclass
class MetricsSection:
    """Prometheus /metrics of this node."""

    listen: str | None = from_field(AgentConfig, "metrics_listen")


@dataclass
class AgentFile:
    """An agent's settings file, section by section."""

    agent: AgentSection = section(AgentSection)
    hardware: HardwareSection = section(HardwareSection)
    accelerators: AcceleratorsSection = section(AcceleratorsSection)
    jobs: JobsSection = section(JobsSection)
    metrics: MetricsSection = section(MetricsSection)
    tls: TLSFiles = section(TLSFiles, "Mutual TLS to the controller: all three files or none (none: plaintext)")
    log: LogSection = section(LogSection)


SCHEMA = Schema(AgentFile, "agent")


# -- flags --------------------------------------------------------------------------------------
def allowed_commands(specs: list[str]) -> dict[str, Any]:
    """--allow-command 'gpu_reset=/usr/bin/nvidia-smi,-r,-i,{gpu}' -> {'gpu_reset': [argv]}.

    The templates are checked with the file's, when the settings are built.
    """
    allowed: dict[str, list[str]] = {}
    for spec in specs:
        kind, sep, argv = spec.partition("=")
        if not sep or not is_configurable(kind) or not argv:
            raise ValueError(
                f"--allow-command {spec!r}: expected KIND=ARGV0,ARG,... with KIND one of {', '.join(CONFIGURABLE)}"
            )
        allowed[kind] = argv.split(",")
    return {"jobs.allowed_commands": allowed}


FLAGS = (
    Flag("--controller", "agent.controllers", split=True, help="controller HOST:PORT (repeat or comma-separate)"),
    Flag("--node-id", "agent.node_id"),
    Flag("--backend", "hardware.backend"),
    Flag("--role", "agent.role"),
    Flag("--interval-s", "agent.interval_s", metavar="SECONDS"),
    Flag("--state-dir", "agent.state_dir", metavar="DIR"),
    Flag("--sysfs-root", "hardware.sysfs_root", metavar="DIR"),
    Flag("--kmsg", "hardware.kmsg", metavar="PATH", help="kernel log to tail ('' to disable)"),
    Flag("--mount", "hardware.mounts", metavar="PATH", help="mount point whose disk usage to report (repeatable)"),
    Flag("--seed", "hardware.seed"),
    Flag("--redis", "hardware.redis", metavar="HOST:PORT"),
    Flag("--lldpcli-socket", "hardware.lldpcli_socket", metavar="PATH"),
    Flag("--lldp-interval-s", "hardware.lldp_interval_s", metavar="SECONDS"),
    Flag("--sim-gpus", "hardware.sim_gpus", metavar="N"),
    Flag("--sim-nics", "hardware.sim_nics", metavar="N"),
    Flag("--sim-real-netdevs", "hardware.sim_real_netdevs"),
    Flag("--metrics", "metrics.listen", metavar="HOST:PORT"),
    Flag("--job-socket", "jobs.socket", metavar="PATH"),
    Flag(
        "--allow-command",
        "jobs.allowed_commands",
        action="append",
        metavar="KIND=ARGV0,ARG,...",
        help="let the controller run this here (repeatable), e.g. gpu_reset=/usr/bin/nvidia-smi,-r,-i,{gpu}; "
        "kinds: gpu_reset, reboot, run_diagnostic. No shell; {gpu} must be a GPU index",
        to=allowed_commands,
    ),
    *TLS_FLAGS,
    LOG_LEVEL_FLAG,
)
ENV_EXAMPLES = ("agent.node_id=node-003", "agent.interval_s=10", "agent.controllers=ctl-a:50051,ctl-b:50051")


# -- building -----------------------------------------------------------------------------------
@dataclass
class AgentOptions:
    """Agent settings that are not AgentConfig fields: how its collectors are built and run."""

    role: str
    backend: str
    state_dir: Path
    sysfs_root: str
    kmsg: str | None
    mounts: list[str]
    ethtool: bool
    seed: int
    redis: str | None
    lldpcli_socket: str | None
    lldp_interval_s: float
    sim_gpus: int
    sim_nics: int
    sim_real_netdevs: bool
    tls: TLSSettings | None
    log: LogSection
    accelerators: AcceleratorsSection | None = None


def load_agent_config(
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Overrides | None = None,
    *,
    flags: Mapping[str, str] | None = None,
) -> tuple[AgentConfig, AgentOptions]:
    """(AgentConfig, AgentOptions) of the file (if any), the environment and ``overrides``; ConfigError otherwise."""
    return read_settings(SCHEMA, path, env, overrides, flags, _build)


load = load_agent_config


def _build(reading: Reading, s: AgentFile) -> tuple[AgentConfig, AgentOptions] | None:
    """The one function from settings to an AgentConfig (whether they came from a file or flags)."""
    a, hw = s.agent, s.hardware
    check_node_id(reading, "agent.node_id", a.node_id)
    check_path(reading, "agent.state_dir", a.state_dir, "folder")
    check_path(reading, "jobs.socket", s.jobs.socket, "file")
    check_path(reading, "hardware.lldpcli_socket", hw.lldpcli_socket, "file")
    # What the agent reads: there on real hardware; the simulator reads its own fakes instead,
    # so there only a path that cannot exist at all (under a file) is refused.
    real = hw.backend != "sim"
    check_path(reading, "hardware.sysfs_root", hw.sysfs_root, "input-folder" if real else "folder")
    check_path(reading, "hardware.kmsg", hw.kmsg or None, "input" if real else "file")
    for i, mount in enumerate(hw.mounts):
        check_path(reading, f"hardware.mounts[{i}]", mount, "input-folder")
    if hw.backend not in backend_names():
        reading.err("hardware.backend", f"must be one of {', '.join(backend_names())}, got {hw.backend!r}")
    try:
        CommandHandler(None, s.jobs.allowed_commands)
    except ValueError as exc:
        reading.err("jobs.allowed_commands", str(exc))
    tls = tls_settings(reading, s.tls)
    if reading.errors:
        return None
    fields = gather(s, AgentConfig)
    fields["boot_id_path"] = str(a.boot_id_path)
    fields["job_socket"] = str(s.jobs.socket) if s.jobs.socket is not None else None
    config = AgentConfig(**fields, role=ROLES[a.role], buffer_path=str(a.state_dir / BUFFER_FILE), tls=tls)
    options = AgentOptions(
        role=a.role,
        backend=hw.backend,
        state_dir=a.state_dir,
        sysfs_root=str(hw.sysfs_root),
        kmsg=hw.kmsg or None,
        mounts=list(hw.mounts),
        ethtool=hw.ethtool,
        seed=hw.seed,
        redis=hw.redis,
        lldpcli_socket=str(hw.lldpcli_socket) if hw.lldpcli_socket is not None else None,
        lldp_interval_s=hw.lldp_interval_s,
        sim_gpus=hw.sim_gpus,
        sim_nics=hw.sim_nics,
        sim_real_netdevs=hw.sim_real_netdevs,
        tls=tls,
        log=s.log,
        accelerators=s.accelerators,
    )
    return config, options


def summary(built: tuple[AgentConfig, AgentOptions]) -> str:
    """One line for `starpulse config check`."""
    cfg, opt = built
    return (
        f"agent {cfg.node_id} ({opt.role}, {opt.backend}): controllers {','.join(cfg.controllers)}, "
        f"every {cfg.interval_s:g}s, state {opt.state_dir}, tls {'on' if opt.tls else 'off'}"
    )
