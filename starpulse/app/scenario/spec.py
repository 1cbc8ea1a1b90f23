"""The scenario file: a fabric, jobs, and faults on a timeline, validated against that fabric.

The format is shared with other tools, so it is checked strictly and every error names
the file, the fault (by index) and the key: a typo in a target must fail at load time,
not as a scenario that silently tests nothing. See ``docs`` in the issue for the format::

    name: leaf-down
    fabric: {nodes: 32, gpus_per_node: 8, rails: 8, nodes_per_block: 16, spines: 8}
    spares: 2
    jobs: [{name: llm, nodes: 32, checkpoint_every_s: 10}]
    interval_s: 0.5
    duration_s: 30
    faults:
      - {at_s: 5, kind: switch_down, target: leaf-b0-r3}
      - {at_s: 12, kind: gpu_xid, target: node-004/gpu-2, xid: 79}
    expect: {incidents: [{kind: switch_fault, root_cause: leaf-b0-r3}], max_incidents: 1}

Targets: a node (``node-004``), a GPU or NIC (``node-004/gpu-2``, ``node-004/nic-5``), a
switch (``leaf-b0-r3``, ``spine-1``), a switch port by index (``leaf-b0-r3:port-N`` is
the switch's N-th port, ``Ethernet{4*N}``; on a leaf ports 0..nodes_per_block-1 face
nodes by slot and port nodes_per_block+k goes to spine k; on a spine port j goes to leaf
j, block-major), or a cable (``node-004/nic-5<->leaf-b0-r5``, ``leaf-b0-r3<->spine-1``,
either order).

Fault kinds, whom each targets and their parameters (``xid``, ``factor``, ``count``...)
are the simulator's fault table (``agent.sim.faults.FAULTS``); this module checks a
file against it and against the fabric.

Probes: ``probes: true`` runs the probe mesh (every node's agent reports the results of its
plan's probes, drawn from the cluster's simulated data plane); it is on by itself when a fault only
probes can see is in the file (``switch_silent_drop``, ``link_loss``, ``link_delay``,
``host_net_delay``, ``nic_cable_loss``), and ``probes: false`` beside one is an error.

Vendors: ``vendors: [nvidia, amd, ascend]`` gives block b of nodes the accelerators of entry
``b % len(vendors)`` (default all NVIDIA); a vendor's own fault kinds (``amd_*``, ``ascend_*``)
and NVIDIA's GPU kinds are refused on a node of another vendor.

Jobs: a job of ``nodes: K`` runs on the first K non-spare nodes in name order. Every job
starts from node 0, so two jobs overlap; ``jobs_of(node)`` lists them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.sim.fault_kinds import FaultError, FaultKind
from agent.sim.faults import FAULTS
from agent.sim.node import SIM_VENDORS
from controller.fabric import Fabric, generate_fabric
from controller.fabric.model import LINK_SEPARATOR
from starpulse.core import vocab
from starpulse.core.schema import ConfigError, Reading, Schema, meta, setting

INCIDENT_KINDS: frozenset[str] = frozenset(vocab.INCIDENT_KINDS)
PORT_SEPARATOR = ":port-"

_FAULT_KEYS = frozenset({"at_s", "kind", "target", "targets", "until_s"})


class ScenarioError(ConfigError):
    """The scenario file is malformed; the message names the file, the place and the key.

    A ConfigError like every other "this file is invalid": one line, exit 2.
    """


@dataclass(frozen=True)
class FabricSpec:
    """generate_fabric's arguments (spares live on the Scenario: they are a top-level key)."""

    nodes: int = field(metadata=meta("Nodes of the generated fabric, spares included", ge=1))
    gpus_per_node: int = setting(8, "GPUs (and rail NICs) per node", ge=1)
    rails: int = setting(8, "Rails: one leaf per rail per block", ge=1)
    nodes_per_block: int = setting(16, "Nodes under one set of leaves", ge=1)
    spines: int = setting(8, "Spine switches (0: leaves only)", ge=0)


@dataclass(frozen=True)
class JobSpec:
    name: str = field(metadata=meta("The job's name, unique in the scenario", nonempty=True))
    nodes: int = field(metadata=meta("Runs on the first K non-spare nodes in name order", ge=1))
    checkpoint_every_s: float | None = setting(None, "Seconds between checkpoints; null: none", gt=0)


@dataclass
class FaultSpec:
    """One fault: ``params`` holds the kind's own keys (xid, factor, count, ...)."""

    at_s: float
    kind: str
    target: str = ""
    targets: list[str] = field(default_factory=list)
    until_s: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        where = self.target or ",".join(self.targets)
        return f"{self.kind}@{where}"


@dataclass(frozen=True)
class ExpectedIncident:
    kind: str = field(metadata=meta("An incident kind", choices=tuple(sorted(INCIDENT_KINDS))))
    root_cause: str | None = setting(None, "A fabric component, or job:NAME for a job_hang; null: any root cause")
    resolved: bool | None = setting(
        None, "true: it must also resolve before the run ends (its fault cleared); null: not checked"
    )


@dataclass(frozen=True)
class Expectations:
    """What the test suite checks after a run (the checking lives elsewhere)."""

    incidents: list[ExpectedIncident] = setting([], "Incidents that must open")
    forbid_kinds: list[str] = setting([], "Incident kinds that must not open", choices=tuple(sorted(INCIDENT_KINDS)))
    max_incidents: int | None = setting(None, "At most this many incidents", ge=0)
    evictions: list[str] | None = setting(None, "Exactly these nodes evicted (null: not checked)")
    resumed_jobs: list[str] = setting([], "Jobs that must restart and resume")


@dataclass(frozen=True)
class GuardLimits:
    """Healer guard limits other than their defaults (a scenario that heals several nodes at once)."""

    max_evictions_per_window: int | None = setting(None, "Evictions per guard window", ge=0)
    max_fleet_share: float | None = setting(None, "Share of the fleet out at once", gt=0, le=1)


@dataclass(frozen=True)
class ScenarioFile:
    """The keys of a scenario file, as the settings schema reads them (every shape error at once)."""

    name: str = field(metadata=meta("The scenario's name", nonempty=True))
    fabric: FabricSpec = field(metadata=meta("The generated fabric"))
    duration_s: float = field(metadata=meta("Seconds the scenario runs", gt=0))
    spares: int = setting(0, "Hot spare nodes added to the fabric", ge=0)
    interval_s: float = setting(0.5, "Seconds between agent reports", gt=0)
    vendors: list[str] = setting(
        ["nvidia"], "Accelerator vendor per block, repeating", choices=SIM_VENDORS, nonempty=True
    )
    guards: GuardLimits = field(default_factory=GuardLimits, metadata=meta("Healer guard limits"))
    probes: bool | None = setting(
        None,
        "Run the probe mesh (agents report their plan's probes, drawn from the simulated data plane);"
        " null: on when a fault needs it (switch_silent_drop, link_loss, link_delay, host_net_delay, nic_cable_loss)",
    )
    jobs: list[JobSpec] | None = setting([], "Training jobs")
    faults: list[dict[str, Any]] = setting([], "Faults on the timeline (keys: the fault table's)")
    expect: Expectations = field(default_factory=Expectations, metadata=meta("What the run must show"))


_SCHEMA = Schema(ScenarioFile, "scenario")


@dataclass
class Scenario:
    name: str
    fabric: FabricSpec
    spares: int = 0
    jobs: list[JobSpec] = field(default_factory=list)
    interval_s: float = 0.5
    duration_s: float = 30.0
    faults: list[FaultSpec] = field(default_factory=list)
    expect: Expectations | None = None
    source: str = "<scenario>"
    # The accelerator vendor of each block of nodes, in block order, repeating (["nvidia"]: all NVIDIA).
    vendors: list[str] = field(default_factory=lambda: ["nvidia"])
    # Healer guard limits other than their defaults (a scenario that heals several nodes at once):
    # max_evictions_per_window (an integer), max_fleet_share (a share of the fleet, (0, 1]).
    guards: dict[str, float] = field(default_factory=dict)
    # The probe mesh runs (a fault only probes see is in the file, or the file says ``probes: true``).
    probes: bool = False
    _fabric: Fabric | None = field(default=None, repr=False, compare=False)

    def build_fabric(self) -> Fabric:
        """The declared fabric (generated once, then cached: validation and the cluster share it)."""
        if self._fabric is None:
            f = self.fabric
            self._fabric = generate_fabric(
                f.nodes, f.gpus_per_node, f.rails, f.nodes_per_block, f.spines, spares=self.spares
            )
        return self._fabric

    def vendor_of(self, node: str) -> str:
        """The accelerator vendor of a node: its block's entry of ``vendors``."""
        return self.vendors[self.build_fabric().block_of(node) % len(self.vendors)]

    def job_nodes(self, job: str) -> list[str]:
        """The nodes a job runs on: the first K non-spare nodes in name order."""
        for spec in self.jobs:
            if spec.name == job:
                fabric = self.build_fabric()
                return [n for n in fabric.nodes() if not fabric.is_spare(n)][: spec.nodes]
        raise KeyError(f"no job {job!r} in scenario {self.name!r}")

    def jobs_of(self, node: str) -> list[str]:
        """Jobs running on ``node``, in file order ([] for a spare or an idle node)."""
        return [j.name for j in self.jobs if node in self.job_nodes(j.name)]


# -- loading -------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file; ScenarioError on anything wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{p}: not valid YAML: {exc}") from exc
    return parse_scenario(data, str(p))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(float(v))


class _Checker:
    """Builds error messages that say where: '<file>: faults[3].target: ...'."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {where}: {message}")

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"must be a mapping, got {type(value).__name__}")
        return value

    def number(self, m: Mapping[str, Any], key: str, where: str, default: float | None, positive: bool) -> float:
        v = m.get(key, default)
        name = f"{where}.{key}" if where else key
        if v is None:
            raise self.fail(name, "is required")
        if not _is_num(v):
            raise self.fail(name, f"must be a number, got {v!r}")
        if v < 0 or (positive and v == 0):
            raise self.fail(name, f"must be {'> 0' if positive else '>= 0'}, got {v}")
        return float(v)


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a scenario already read into Python objects (YAML's output); every error at once.

    The shape (keys, types, bounds) is the schema's (``ScenarioFile``); what a schema cannot
    say (a fault against the fault table and the fabric, a job against the fabric's size, an
    expectation against the fabric) is checked after it, through the same error list.
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: scenario: must be a mapping, got {type(data).__name__}")
    reading = Reading(_SCHEMA, source, dict(data))
    f = reading.read()
    if f is None:
        raise ScenarioError(reading.errors)
    scenario = Scenario(
        name=f.name,
        fabric=f.fabric,
        spares=f.spares,
        interval_s=f.interval_s,
        duration_s=f.duration_s,
        source=source,
        vendors=list(f.vendors),
        guards={k: v for k, v in vars(f.guards).items() if v is not None},
        jobs=list(f.jobs or []),
        expect=f.expect if data.get("expect") is not None else None,
    )
    try:
        fabric = scenario.build_fabric()
    except ValueError as exc:
        raise ScenarioError(f"{source}: fabric: {exc}") from exc
    _check_jobs(reading, scenario, f.fabric.nodes)
    for i, raw in enumerate(f.faults):
        try:
            scenario.faults.append(_parse_fault(_Checker(source), raw, i, scenario.duration_s, fabric))
        except ScenarioError as exc:
            reading.errors.extend(exc.errors)
            continue
        _check_vendor(reading, scenario, i)
    _check_probes(reading, scenario, f.probes)
    if scenario.expect is not None:
        _check_expect(reading, scenario.expect, fabric)
    if reading.errors:
        raise ScenarioError(reading.errors)
    return scenario


def _check_jobs(reading: Reading, scenario: Scenario, regular_nodes: int) -> None:
    seen: set[str] = set()
    for i, job in enumerate(scenario.jobs):
        if job.name in seen:
            reading.err(f"jobs[{i}].name", f"duplicate job name {job.name!r}")
        seen.add(job.name)
        if job.nodes > regular_nodes:
            reading.err(f"jobs[{i}].nodes", f"{job.nodes} nodes but the fabric has {regular_nodes} non-spare nodes")


def _check_probes(reading: Reading, scenario: Scenario, asked: bool | None) -> None:
    """Whether the probe mesh runs; a fault only probes see in a file that turns them off is an error."""
    probed = [i for i, fault in enumerate(scenario.faults) if FAULTS[fault.kind].probed]
    if asked is False and probed:
        i = probed[0]
        reading.err(f"faults[{i}].kind", f"{scenario.faults[i].kind} is seen only by probes, and `probes` is false")
    scenario.probes = bool(probed) if asked is None else asked


def _check_vendor(reading: Reading, scenario: Scenario, i: int) -> None:
    fault = scenario.faults[-1]
    needs = FAULTS[fault.kind].needs_vendor
    node = fault.target.partition("/")[0]
    if needs is not None and node and scenario.vendor_of(node) != needs:
        have = scenario.vendor_of(node)
        reading.err(f"faults[{i}].target", f"{fault.kind} acts on {needs} GPUs; {node} has {have} ones")


def _check_expect(reading: Reading, expect: Expectations, fabric: Fabric) -> None:
    """What the schema cannot say about expectations: fabric components, and keys that contradict."""
    for i, inc in enumerate(expect.incidents):
        if inc.root_cause and not inc.root_cause.startswith("job:"):  # a job (job_hang) is no fabric component
            try:
                fabric.component_type(inc.root_cause)
            except (KeyError, ValueError) as exc:
                reading.err(f"expect.incidents[{i}].root_cause", f"{inc.root_cause!r} is not in the fabric ({exc})")
    clash = sorted({e.kind for e in expect.incidents} & set(expect.forbid_kinds))
    if clash:
        reading.err("expect.forbid_kinds", f"forbids {clash[0]!r}, which expect.incidents requires")
    if expect.max_incidents is not None and expect.max_incidents < len(expect.incidents):
        n = len(expect.incidents)
        reading.err("expect.max_incidents", f"{expect.max_incidents} is fewer than the {n} incidents expected")
    missing = [n for n in expect.evictions or [] if n not in fabric]
    if missing:
        reading.err("expect.evictions", f"must be a list of fabric nodes, got {missing[0]!r}")


# -- targets ---------------------------------------------------------------------------------


def switch_port(fabric: Fabric, target: str) -> tuple[str, str]:
    """``leaf-b0-r3:port-N`` -> (switch, ``Ethernet{4*N}``); ValueError when it is not a port there."""
    switch, sep, index = target.partition(PORT_SEPARATOR)
    if not sep or not index.isdigit():
        raise ValueError(f"{target!r} is not a switch port ('<switch>{PORT_SEPARATOR}N')")
    if switch not in fabric or fabric.kind(switch) not in ("leaf", "spine"):
        raise ValueError(f"{switch!r} is not a switch in the fabric")
    n = int(index)
    count = switch_port_count(fabric, switch)
    if n >= count:
        raise ValueError(f"{switch} has ports 0..{count - 1}, not {n}")
    return switch, f"Ethernet{4 * n}"


def switch_port_count(fabric: Fabric, switch: str) -> int:
    """Ports a switch has: a leaf one per node slot plus one per spine; a spine one per leaf."""
    if fabric.kind(switch) == "leaf":
        return int(fabric.params["nodes_per_block"]) + len(fabric.spines())
    return len(fabric.leaves())


def target_kind(fabric: Fabric, target: str) -> str:
    """'node', 'gpu', 'nic', 'switch', 'port' or 'link'; ValueError when the fabric has no such thing."""
    if PORT_SEPARATOR in target:
        switch_port(fabric, target)
        return "port"
    if LINK_SEPARATOR in target:
        a, b = Fabric.link_ends(target)
        for end in (a, b):
            if end not in fabric:
                raise ValueError(f"link end {end!r} is not in the fabric")
        if not fabric.graph.has_edge(a, b) or fabric.graph.edges[a, b].get("kind") not in ("nic-leaf", "leaf-spine"):
            raise ValueError(f"there is no cable between {a!r} and {b!r}")
        return "link"
    if target not in fabric:
        raise ValueError(f"{target!r} is not in the fabric")
    kind = fabric.kind(target)
    return "switch" if kind in ("leaf", "spine") else kind


# -- faults ----------------------------------------------------------------------------------


def _parse_fault(c: _Checker, raw: Any, i: int, duration_s: float, fabric: Fabric) -> FaultSpec:
    """One fault, checked against its kind in the simulator's fault table and against the fabric."""
    where = f"faults[{i}]"
    m = c.mapping(raw, where)
    kind = FAULTS.get(m.get("kind"))
    if kind is None:
        known = ", ".join(sorted(FAULTS.names()))
        raise c.fail(f"{where}.kind", f"unknown fault kind {m.get('kind')!r} (known: {known})")
    at_s = c.number(m, "at_s", where, None, positive=False)
    if at_s >= duration_s:
        raise c.fail(f"{where}.at_s", f"{at_s:g} is not inside the scenario [0, {duration_s:g})")
    until_s: float | None = None
    if m.get("until_s") is not None:
        until_s = c.number(m, "until_s", where, None, positive=False)
        if until_s <= at_s:
            raise c.fail(f"{where}.until_s", f"{until_s:g} must be after at_s {at_s:g}")
    fault = FaultSpec(at_s=at_s, kind=kind.name, until_s=until_s)
    shape: str | None = None
    if kind.many:
        fault.targets = _parse_targets(c, m, where, kind, fabric)
    else:
        fault.target, shape = _parse_target(c, m, where, kind, fabric)
    try:
        fault.params = kind.check_params({k: v for k, v in m.items() if k not in _FAULT_KEYS}, shape)
    except FaultError as exc:
        raise c.fail(f"{where}.{exc.key}", exc.message) from exc
    return fault


def _shapes(kind: FaultKind) -> str:
    return " or ".join(sorted(kind.targets))


def _parse_target(c: _Checker, m: Mapping[str, Any], where: str, kind: FaultKind, fabric: Fabric) -> tuple[str, str]:
    """The one ``target`` of a kind that takes one, and its shape on the fabric."""
    if "targets" in m:
        many = " or ".join(f"a {k.name}" for k in FAULTS if k.many)
        raise c.fail(f"{where}.targets", f"only {many} takes `targets`; {kind.name} takes one `target`")
    if "target" not in m:
        raise c.fail(f"{where}.target", f"missing target for {kind.name}")
    target = m["target"]
    if not isinstance(target, str) or not target:
        raise c.fail(f"{where}.target", f"must be a non-empty string, got {target!r}")
    try:
        shape = target_kind(fabric, target)
    except ValueError as exc:
        raise c.fail(f"{where}.target", str(exc)) from exc
    if shape not in kind.targets:
        raise c.fail(f"{where}.target", f"{kind.name} takes a {_shapes(kind)}, not a {shape} ({target!r})")
    return target, shape


def _parse_targets(c: _Checker, m: Mapping[str, Any], where: str, kind: FaultKind, fabric: Fabric) -> list[str]:
    """The ``targets`` list of a kind that takes several (a partition)."""
    if "target" in m:
        raise c.fail(f"{where}.target", f"a {kind.name} takes `targets` (a list, each a {_shapes(kind)}), not `target`")
    targets = m.get("targets")
    if not isinstance(targets, list) or not targets:
        raise c.fail(f"{where}.targets", f"a {kind.name} needs `targets`: a non-empty list, each a {_shapes(kind)}")
    for j, t in enumerate(targets):
        try:
            ok = isinstance(t, str) and target_kind(fabric, t) in kind.targets
        except ValueError:
            ok = False
        if not ok:
            raise c.fail(f"{where}.targets[{j}]", f"{t!r} is not a {_shapes(kind)} in the fabric")
    if len(set(targets)) != len(targets):
        raise c.fail(f"{where}.targets", "lists a target twice")
    return list(targets)


# -- expectations ------------------------------------------------------------------------------
