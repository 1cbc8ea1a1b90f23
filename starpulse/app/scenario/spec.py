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
from starpulse.core.schema import ConfigError

INCIDENT_KINDS: frozenset[str] = frozenset(vocab.INCIDENT_KINDS)
PORT_SEPARATOR = ":port-"

_FAULT_KEYS = frozenset({"at_s", "kind", "target", "targets", "until_s"})
_TOP_KEYS = frozenset(
    {"name", "fabric", "vendors", "spares", "jobs", "interval_s", "duration_s", "guards", "faults", "expect"}
)
_FABRIC_KEYS = ("nodes", "gpus_per_node", "rails", "nodes_per_block", "spines")


class ScenarioError(ConfigError):
    """The scenario file is malformed; the message names the file, the place and the key.

    A ConfigError like every other "this file is invalid": one line, exit 2.
    """


@dataclass(frozen=True)
class FabricSpec:
    """generate_fabric's arguments (spares live on the Scenario: they are a top-level key)."""

    nodes: int
    gpus_per_node: int = 8
    rails: int = 8
    nodes_per_block: int = 16
    spines: int = 8


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    checkpoint_every_s: float | None = None


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
    kind: str
    root_cause: str | None = None  # None: any root cause


@dataclass(frozen=True)
class Expectations:
    """What the test suite checks after a run (the checking lives elsewhere)."""

    incidents: list[ExpectedIncident] = field(default_factory=list)
    forbid_kinds: list[str] = field(default_factory=list)
    max_incidents: int | None = None
    evictions: list[str] | None = None  # exactly these nodes evicted (None: not checked)
    resumed_jobs: list[str] = field(default_factory=list)  # jobs that must restart and resume


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

    def keys(self, m: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
        unknown = sorted(str(k) for k in m if k not in allowed)
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}", f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def string(self, m: Mapping[str, Any], key: str, where: str) -> str:
        v = m.get(key)
        if not isinstance(v, str) or not v.strip():
            raise self.fail(f"{where}.{key}" if where else key, "must be a non-empty string")
        return v

    def integer(self, m: Mapping[str, Any], key: str, where: str, default: int | None, minimum: int) -> int:
        v = m.get(key, default)
        name = f"{where}.{key}" if where else key
        if v is None:
            raise self.fail(name, "is required")
        if not _is_int(v):
            raise self.fail(name, f"must be an integer, got {v!r}")
        if v < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {v}")
        return int(v)

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
    """Validate a scenario already read into Python objects (YAML's output)."""
    c = _Checker(source)
    top = c.mapping(data, "scenario")
    c.keys(top, _TOP_KEYS, "scenario")
    name = c.string(top, "name", "")
    fab = c.mapping(top.get("fabric"), "fabric")
    c.keys(fab, frozenset(_FABRIC_KEYS), "fabric")
    defaults = FabricSpec(nodes=1)
    fabric = FabricSpec(
        nodes=c.integer(fab, "nodes", "fabric", None, 1),
        gpus_per_node=c.integer(fab, "gpus_per_node", "fabric", defaults.gpus_per_node, 1),
        rails=c.integer(fab, "rails", "fabric", defaults.rails, 1),
        nodes_per_block=c.integer(fab, "nodes_per_block", "fabric", defaults.nodes_per_block, 1),
        spines=c.integer(fab, "spines", "fabric", defaults.spines, 0),
    )
    scenario = Scenario(
        name=name,
        fabric=fabric,
        spares=c.integer(top, "spares", "", 0, 0),
        interval_s=c.number(top, "interval_s", "", 0.5, positive=True),
        duration_s=c.number(top, "duration_s", "", None, positive=True),
        source=source,
    )
    try:
        fabric_graph = scenario.build_fabric()
    except ValueError as exc:
        raise c.fail("fabric", str(exc)) from exc
    scenario.vendors = _parse_vendors(c, top.get("vendors", ["nvidia"]))
    scenario.guards = _parse_guards(c, top.get("guards"))
    scenario.jobs = _parse_jobs(c, top.get("jobs", []), fabric.nodes)
    faults = top.get("faults", [])
    if not isinstance(faults, list):
        raise c.fail("faults", "must be a list")
    scenario.faults = [_parse_fault(c, raw, i, scenario.duration_s, fabric_graph) for i, raw in enumerate(faults)]
    for i, fault in enumerate(scenario.faults):
        needs = FAULTS[fault.kind].needs_vendor
        node = fault.target.partition("/")[0]
        if needs is not None and node and scenario.vendor_of(node) != needs:
            raise c.fail(
                f"faults[{i}].target", f"{fault.kind} acts on {needs} GPUs; {node} has {scenario.vendor_of(node)} ones"
            )
    if top.get("expect") is not None:
        scenario.expect = _parse_expect(c, top["expect"], fabric_graph)
    return scenario


def _parse_guards(c: _Checker, raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    m = c.mapping(raw, "guards")
    c.keys(m, frozenset({"max_evictions_per_window", "max_fleet_share"}), "guards")
    out: dict[str, float] = {}
    if "max_evictions_per_window" in m:
        out["max_evictions_per_window"] = c.integer(m, "max_evictions_per_window", "guards", None, 0)
    if "max_fleet_share" in m:
        share = c.number(m, "max_fleet_share", "guards", None, positive=True)
        if share > 1:
            raise c.fail("guards.max_fleet_share", f"must be in (0, 1], got {share:g}")
        out["max_fleet_share"] = share
    return out


def _parse_vendors(c: _Checker, raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise c.fail("vendors", f"must be a non-empty list of {', '.join(SIM_VENDORS)} (one per block)")
    for i, v in enumerate(raw):
        if v not in SIM_VENDORS:
            raise c.fail(f"vendors[{i}]", f"must be one of {', '.join(SIM_VENDORS)}, got {v!r}")
    return list(raw)


def _parse_jobs(c: _Checker, raw: Any, regular_nodes: int) -> list[JobSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise c.fail("jobs", "must be a list")
    jobs: list[JobSpec] = []
    for i, item in enumerate(raw):
        where = f"jobs[{i}]"
        m = c.mapping(item, where)
        c.keys(m, {"name", "nodes", "checkpoint_every_s"}, where)
        name = c.string(m, "name", where)
        if any(j.name == name for j in jobs):
            raise c.fail(f"{where}.name", f"duplicate job name {name!r}")
        nodes = c.integer(m, "nodes", where, None, 1)
        if nodes > regular_nodes:
            raise c.fail(f"{where}.nodes", f"{nodes} nodes but the fabric has {regular_nodes} non-spare nodes")
        ckpt = c.number(m, "checkpoint_every_s", where, None, True) if "checkpoint_every_s" in m else None
        jobs.append(JobSpec(name=name, nodes=nodes, checkpoint_every_s=ckpt))
    return jobs


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


# Complexity over 15 on purpose: one check per expectation key, every error naming the scenario file.
def _parse_expect(c: _Checker, raw: Any, fabric: Fabric) -> Expectations:  # noqa: C901
    m = c.mapping(raw, "expect")
    c.keys(m, {"incidents", "forbid_kinds", "max_incidents", "evictions", "resumed_jobs"}, "expect")
    incidents: list[ExpectedIncident] = []
    raw_incidents = m.get("incidents", [])
    if not isinstance(raw_incidents, list):
        raise c.fail("expect.incidents", "must be a list")
    for i, item in enumerate(raw_incidents):
        where = f"expect.incidents[{i}]"
        inc = c.mapping(item, where)
        c.keys(inc, {"kind", "root_cause"}, where)
        kind = inc.get("kind")
        if kind not in INCIDENT_KINDS:
            known = ", ".join(sorted(INCIDENT_KINDS))
            raise c.fail(f"{where}.kind", f"unknown incident kind {kind!r} (known: {known})")
        root = inc.get("root_cause")
        if root is not None:
            if not isinstance(root, str):
                raise c.fail(f"{where}.root_cause", f"must be a string, got {root!r}")
            if root and not root.startswith("job:"):  # a job (job_hang) is no fabric component
                try:
                    fabric.component_type(root)
                except (KeyError, ValueError) as exc:
                    raise c.fail(f"{where}.root_cause", f"{root!r} is not in the fabric ({exc})") from exc
        incidents.append(ExpectedIncident(kind=str(kind), root_cause=root))
    forbid = m.get("forbid_kinds", [])
    if not isinstance(forbid, list):
        raise c.fail("expect.forbid_kinds", "must be a list")
    for i, k in enumerate(forbid):
        if k not in INCIDENT_KINDS:
            raise c.fail(f"expect.forbid_kinds[{i}]", f"unknown incident kind {k!r}")
    clash = sorted({e.kind for e in incidents} & set(forbid))
    if clash:
        raise c.fail("expect.forbid_kinds", f"forbids {clash[0]!r}, which expect.incidents requires")
    max_incidents = c.integer(m, "max_incidents", "expect", None, 0) if "max_incidents" in m else None
    if max_incidents is not None and max_incidents < len(incidents):
        raise c.fail("expect.max_incidents", f"{max_incidents} is fewer than the {len(incidents)} incidents expected")
    evictions: list[str] | None = None
    if "evictions" in m:
        raw_ev = m["evictions"]
        if not isinstance(raw_ev, list) or not all(isinstance(n, str) and n in fabric for n in raw_ev):
            raise c.fail("expect.evictions", f"must be a list of fabric nodes, got {raw_ev!r}")
        evictions = list(raw_ev)
    resumed = m.get("resumed_jobs", [])
    if not isinstance(resumed, list) or not all(isinstance(j, str) for j in resumed):
        raise c.fail("expect.resumed_jobs", f"must be a list of job names, got {resumed!r}")
    return Expectations(
        incidents=incidents,
        forbid_kinds=list(forbid),
        max_incidents=max_incidents,
        evictions=evictions,
        resumed_jobs=list(resumed),
    )
