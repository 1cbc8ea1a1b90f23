"""The simulator's one fault table: every fault a simulated cluster can suffer, written once.

Each kind says whom it targets (a GPU, a NIC, a node, a switch, a switch port, a cable),
its typed parameters with their defaults, which incident kinds answer it, and what it
does to the fakes: on one simulated node (``SimNode``: fake NVML, sysfs and kernel log)
and, where the fabric is involved, through the simulated cluster (cable ends, switches,
agents), which an entry reaches through the small ``ClusterSurface`` protocol rather
than by knowing the cluster. The scenario format checks faults against this table,
``SimNode`` and the scenario cluster inject and clear through it, and the demo draws its
faults from it: a new fault kind is one entry in ``FAULTS`` (plus the fake's surface, if
it needs a new one).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from agent.sim.fake_nvml import H100_NVLINKS
from starpulse.core import vocab

if TYPE_CHECKING:
    from agent.sim.fake_switch import FakeSwitch
    from agent.sim.node import SimNode

# What a fault can be aimed at. The scenario format resolves a target to one of these on its
# fabric ("node-004/gpu-2" is a gpu, "leaf-b0-r3:port-1" a port, "a<->b" a link).
SHAPES: Final[frozenset[str]] = frozenset({"node", "gpu", "nic", "switch", "port", "link"})
# The parts of one simulated node a node action can act on ("gpu-2", "nic-5").
NODE_PARTS: Final[frozenset[str]] = frozenset({"gpu", "nic"})

Params = Mapping[str, Any]


class UnknownFault(ValueError):
    """No such fault kind, or a target this kind (or this node) does not have."""


class FaultError(ValueError):
    """A fault's parameter is wrong; ``key`` names it (the scenario format adds the file and fault index)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def part_index(target: str, part: str) -> int:
    """'gpu-2' -> 2 for part 'gpu'; also accepts 'node-003/gpu-2'. UnknownFault for another part."""
    leaf = target.rsplit("/", 1)[-1]
    if not leaf.startswith(part + "-") or not leaf[len(part) + 1 :].isdigit():
        raise UnknownFault(f"target {target!r} is not a {part} (expected '{part}-N')")
    return int(leaf[len(part) + 1 :])


class _Required(enum.Enum):
    REQUIRED = "required"


REQUIRED: Final = _Required.REQUIRED


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


@dataclass(frozen=True)
class Param:
    """One parameter of a fault kind: its type, default and bounds, checked when a scenario loads.

    ``default`` is REQUIRED (the fault must say it), None (optional: absent unless given)
    or the value used when the fault leaves it out. ``shapes`` limits it to some target
    shapes (a PFC storm's queue exists on a switch port, not on a NIC).
    """

    name: str
    doc: str
    integer: bool = True
    default: float | _Required | None = REQUIRED
    minimum: float = 0
    exclusive_minimum: bool = False
    maximum: float | None = None
    shapes: frozenset[str] | None = None

    def applies_to(self, shape: str | None) -> bool:
        return self.shapes is None or shape in self.shapes

    def check(self, raw: Params) -> float | None:
        """This parameter's value in ``raw`` (its default when absent); FaultError naming the key otherwise."""
        if self.name not in raw:
            if self.default is REQUIRED:
                raise FaultError(self.name, "is required")
            return self.default
        v = raw[self.name]
        if v is None:
            raise FaultError(self.name, "is required")
        return self._check_int(v) if self.integer else self._check_number(v)

    def _too_low(self, v: float) -> bool:
        return v < self.minimum or (self.exclusive_minimum and v == self.minimum)

    def _check_int(self, v: Any) -> int:
        if not _is_int(v):
            raise FaultError(self.name, f"must be an integer, got {v!r}")
        if self._too_low(v):
            raise FaultError(self.name, f"must be {'>' if self.exclusive_minimum else '>='} {self.minimum:g}, got {v}")
        if self.maximum is not None and v > self.maximum:
            raise FaultError(self.name, f"must be <= {self.maximum:g}, got {v}")
        return int(v)

    def _check_number(self, v: Any) -> float:
        if self.maximum is not None:  # a bounded range: one message says all of it
            low = "(" if self.exclusive_minimum else "["
            if not _is_num(v) or self._too_low(float(v)) or float(v) > self.maximum:
                raise FaultError(self.name, f"must be a number in {low}{self.minimum:g}, {self.maximum:g}], got {v!r}")
            return float(v)
        if not _is_num(v):
            raise FaultError(self.name, f"must be a number, got {v!r}")
        if self._too_low(float(v)):
            raise FaultError(self.name, f"must be {'>' if self.exclusive_minimum else '>='} {self.minimum:g}, got {v}")
        return float(v)


class Fault(Protocol):
    """A placed fault as the scenario format holds one (``FaultSpec``): where, and its checked parameters."""

    @property
    def target(self) -> str: ...

    @property
    def targets(self) -> Sequence[str]: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


class ClusterSurface(Protocol):
    """What a fault that needs the fabric gets from the simulated cluster, on behalf of that one fault.

    Holds are counted per fault: the first fault holding a thing applies it, the last one
    releasing it undoes it, so overlapping faults (a NIC down inside a dead leaf) clear right.
    """

    def shape(self, target: str) -> str:
        """The target's shape on the fabric (one of SHAPES)."""
        ...

    def node(self, target: str) -> SimNode:
        """The simulated node a target is on or is ('node-003/nic-5' -> node-003's SimNode)."""
        ...

    def cut_cables(self, target: str) -> None:
        """Hold down every cable end the target takes with it: a NIC and its switch port, a port and
        the far end, both ends of a link, the far end of every cable of a (dead) switch."""
        ...

    def mend_cables(self, target: str) -> None:
        """Release what ``cut_cables`` held; an end comes up when no fault holds it any more."""
        ...

    def hold(self, what: Hashable) -> bool:
        """Take a hold on ``what``; True when this is the first (the caller applies the fault)."""
        ...

    def release(self, what: Hashable) -> bool:
        """Drop this fault's hold; True when it was the last (the caller undoes the fault)."""
        ...

    def silence(self, name: str) -> None:
        """Cut an agent off from the controller (a dead switch's agent, a partition)."""
        ...

    def unsilence(self, name: str) -> None: ...

    def halt(self, name: str) -> None:
        """Stop an agent as if its machine died."""
        ...

    def revive(self, name: str) -> None:
        """Start a fresh agent on the same buffer once no fault holds the machine down."""
        ...

    def switch_port(self, target: str) -> tuple[str, str]:
        """(switch, port) for a switch port target, or for the switch port a NIC is cabled to."""
        ...

    def switch(self, name: str) -> AbstractContextManager[FakeSwitch]:
        """The switch's fake, locked against its agent's counter updates for the block."""
        ...


NodeAction = Callable[["SimNode", int, Params], None]
ClusterAction = Callable[[ClusterSurface, Fault], None]


@dataclass(frozen=True)
class OnNode:
    """What a kind does to one part ('gpu' or 'nic', by index) of one simulated node."""

    part: str
    inject: NodeAction
    clear: NodeAction


@dataclass(frozen=True)
class OnCluster:
    """What a kind does through the simulated cluster (it needs the fabric: cables, switches, agents)."""

    inject: ClusterAction
    clear: ClusterAction


@dataclass(frozen=True)
class FaultKind:
    """One fault kind: whom it targets, its parameters, what answers it, and its inject and clear.

    In a cluster a kind acts through ``cluster`` when it has one, else by its ``node``
    action on the target's node. ``many``: the kind takes a list of ``targets`` instead
    of one ``target``. ``demo``: parameter sets the demo draws from (empty: not in the
    demo). ``answered_by_effect``: an incident that lists the target's node among the
    affected answers it (a straggler is found by its effect on the job, not at its GPU).
    """

    name: str
    doc: str
    targets: frozenset[str]
    incidents: tuple[str, ...]
    params: tuple[Param, ...] = ()
    node: OnNode | None = None
    cluster: OnCluster | None = None
    many: bool = False
    demo: tuple[Params, ...] = ()
    answered_by_effect: bool = False

    def check_params(self, raw: Params, shape: str | None) -> dict[str, Any]:
        """The fault's parameters checked, defaults filled in; FaultError naming the first bad key."""
        out: dict[str, Any] = {}
        allowed: list[str] = []
        for param in self.params:
            if not param.applies_to(shape):
                continue
            allowed.append(param.name)
            value = param.check(raw)
            if value is not None:
                out[param.name] = value
        unknown = sorted(str(k) for k in raw if k not in allowed)
        if unknown:
            raise FaultError(unknown[0], f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return out

    def inject(self, cluster: ClusterSurface, fault: Fault) -> None:
        """Start this fault in a simulated cluster."""
        self._act(cluster, fault, starting=True)

    def clear(self, cluster: ClusterSurface, fault: Fault) -> None:
        """End this fault in a simulated cluster (other faults keep their holds)."""
        self._act(cluster, fault, starting=False)

    def _act(self, cluster: ClusterSurface, fault: Fault, starting: bool) -> None:
        if self.cluster is not None:
            (self.cluster.inject if starting else self.cluster.clear)(cluster, fault)
            return
        if self.node is None:
            raise UnknownFault(f"fault kind {self.name!r} has neither a node nor a cluster action")
        action = self.node.inject if starting else self.node.clear
        action(cluster.node(fault.target), part_index(fault.target, self.node.part), fault.params)


class FaultTable:
    """The registry of fault kinds, in the order written; a kind registered twice is an error."""

    def __init__(self, kinds: Iterable[FaultKind] = ()) -> None:
        self._kinds: dict[str, FaultKind] = {}
        for kind in kinds:
            self.register(kind)

    def register(self, kind: FaultKind) -> None:
        """Add a kind after checking it is whole; ValueError saying what is wrong with it."""
        if kind.name in self._kinds:
            raise ValueError(f"fault kind {kind.name!r} is registered twice")
        problem = next(_problems(kind), None)
        if problem is not None:
            raise ValueError(f"fault kind {kind.name!r}: {problem}")
        self._kinds[kind.name] = kind

    def __getitem__(self, name: str) -> FaultKind:
        kind = self._kinds.get(name)
        if kind is None:
            raise UnknownFault(f"unknown fault kind {name!r} (known: {', '.join(sorted(self._kinds))})")
        return kind

    def get(self, name: object) -> FaultKind | None:
        return self._kinds.get(name) if isinstance(name, str) else None

    def __iter__(self) -> Iterator[FaultKind]:
        return iter(self._kinds.values())

    def __len__(self) -> int:
        return len(self._kinds)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._kinds

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def on_node(self, name: str) -> tuple[FaultKind, OnNode]:
        """A kind that acts on one simulated node, and that action; UnknownFault for any other."""
        kind = self._kinds.get(name)
        if kind is None or kind.node is None:
            node_kinds = sorted(k.name for k in self if k.node is not None)
            raise UnknownFault(f"fault kind {name!r} is not a node fault ({node_kinds})")
        return kind, kind.node


def _problems(kind: FaultKind) -> Iterator[str]:
    """What makes an entry unusable (checked once, when the table is built)."""
    if not kind.targets or not kind.targets <= SHAPES:
        yield f"targets {sorted(kind.targets)} must be some of {sorted(SHAPES)}"
    if not kind.incidents or not set(kind.incidents) <= set(vocab.INCIDENT_KINDS):
        yield f"incidents {list(kind.incidents)} must be some of {list(vocab.INCIDENT_KINDS)}"
    names = [p.name for p in kind.params]
    if len(set(names)) != len(names):
        yield f"a parameter is listed twice in {names}"
    for param in kind.params:
        if param.shapes is not None and not param.shapes <= kind.targets:
            yield f"parameter {param.name!r} is for shapes {sorted(param.shapes)} the kind does not target"
    if kind.node is None and kind.cluster is None:
        yield "it has neither a node action nor a cluster action"
    if kind.node is not None and (kind.node.part not in NODE_PARTS or kind.node.part not in kind.targets):
        yield f"its node action's part {kind.node.part!r} must be a gpu or nic it targets"
    if kind.cluster is None and (kind.many or kind.targets != {kind.node.part if kind.node else ""}):
        yield "targets beyond one node's gpu or nic need a cluster action"
    if kind.demo and kind.node is None:
        yield "only a kind with a node action can be in the demo"
    for params in kind.demo:
        try:
            kind.check_params(params, kind.node.part if kind.node else None)
        except FaultError as exc:
            yield f"demo parameters {dict(params)}: {exc}"


# -- node actions: one part of one SimNode --------------------------------------------------


def _gpu_healthy(sim: SimNode, i: int, p: Params) -> None:
    """Every GPU fault's clear: the GPU is back as it was built (NVML's view of it; the log stays)."""
    sim.nvml.clear(i)


def _gpu_xid(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_xid(i, p["xid"])
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), p["xid"], "injected by the simulator")


def _gpu_ecc_dbe(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_ecc_dbe(i)
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), 48, "An uncorrectable double bit error (DBE) has been detected")


def _gpu_lost(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_gpu_lost(i)
    sim.kmsg.fallen_off_bus(sim.nvml.gpu(i).pci_bus_id.lower()[4:], with_xid=True)


def _gpu_row_remap_failure(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_row_remap_failure(i)
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), 64, "Row remapping failure")


def _gpu_nvlink_down(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_nvlink_down(i, p["link"])


def _gpu_thermal_slowdown(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.inject_thermal_slowdown(i)


def _gpu_slow(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.set_slow(i, p["factor"])
    sim.scale_throughput(p["factor"])  # the whole node's collective traffic waits for its slowest GPU


def _gpu_slow_clear(sim: SimNode, i: int, p: Params) -> None:
    sim.nvml.clear(i)
    sim.restore_throughput()


def _nic_down(sim: SimNode, i: int, p: Params) -> None:
    sim.port_down(i)


def _nic_up(sim: SimNode, i: int, p: Params) -> None:
    sim.port_up(i)


def _one_shot(sim: SimNode, i: int, p: Params) -> None:
    """The clear of a fault that happened and is over (flaps, an error burst): nothing is left to undo."""


def _nic_flap(sim: SimNode, i: int, p: Params) -> None:
    sim.sysfs.flap(i, p["count"])


def _nic_errors(sim: SimNode, i: int, p: Params) -> None:
    sim.sysfs.error_burst(i, p["n"])


def _nic_degraded(sim: SimNode, i: int, p: Params) -> None:
    sim.degrade(i, p["rate_gbps"])


def _nic_degraded_clear(sim: SimNode, i: int, p: Params) -> None:
    sim.undegrade(i, p["rate_gbps"])


def _nic_storm(sim: SimNode, i: int, p: Params) -> None:
    sim.sysfs.pfc_storm(i, True)


def _nic_storm_clear(sim: SimNode, i: int, p: Params) -> None:
    sim.sysfs.pfc_storm(i, False)


# -- cluster actions: the fabric ------------------------------------------------------------


def _cut(c: ClusterSurface, f: Fault) -> None:
    c.cut_cables(f.target)


def _mend(c: ClusterSurface, f: Fault) -> None:
    c.mend_cables(f.target)


def _switch_down(c: ClusterSurface, f: Fault) -> None:
    """A dead switch goes silent and its peers see their ends go down; its own tables say nothing."""
    c.cut_cables(f.target)
    c.silence(f.target)


def _switch_up(c: ClusterSurface, f: Fault) -> None:
    c.mend_cables(f.target)
    c.unsilence(f.target)


def _pfc_storm(c: ClusterSurface, f: Fault) -> None:
    if c.shape(f.target) == "port":
        switch, port = c.switch_port(f.target)
        if c.hold(("storm", switch, port)):
            with c.switch(switch) as fake:
                fake.pfc_storm(port, True, queue=f.params.get("queue"))
    elif c.hold(("storm", f.target)):
        _nic_storm(c.node(f.target), part_index(f.target, "nic"), f.params)


def _pfc_storm_clear(c: ClusterSurface, f: Fault) -> None:
    if c.shape(f.target) == "port":
        switch, port = c.switch_port(f.target)
        if c.release(("storm", switch, port)):
            with c.switch(switch) as fake:
                fake.pfc_storm(port, False)
    elif c.release(("storm", f.target)):
        _nic_storm_clear(c.node(f.target), part_index(f.target, "nic"), f.params)


def _optics(on: bool) -> ClusterAction:
    def act(c: ClusterSurface, f: Fault) -> None:
        switch, port = c.switch_port(f.target)
        if c.hold(("optics", switch, port)) if on else c.release(("optics", switch, port)):
            with c.switch(switch) as fake:
                fake.optics_degraded(port, on)

    return act


def _node_down(c: ClusterSurface, f: Fault) -> None:
    c.halt(f.target)


def _node_up(c: ClusterSurface, f: Fault) -> None:
    c.revive(f.target)


def _partition(c: ClusterSurface, f: Fault) -> None:
    for name in f.targets:
        c.silence(name)


def _partition_clear(c: ClusterSurface, f: Fault) -> None:
    for name in f.targets:
        c.unsilence(name)


# -- the table --------------------------------------------------------------------------------

_GPU = frozenset({"gpu"})
_NIC = frozenset({"nic"})
_GPU_INCIDENTS = ("gpu_fault", "node_fault")
_NIC_INCIDENTS = ("nic_fault", "link_fault")


def _gpu_kind(name: str, doc: str, inject: NodeAction, *, demo: tuple[Params, ...] = (), **kw: Any) -> FaultKind:
    return FaultKind(name, doc, _GPU, _GPU_INCIDENTS, node=OnNode("gpu", inject, _gpu_healthy), demo=demo, **kw)


FAULTS: Final[FaultTable] = FaultTable(
    [
        _gpu_kind(
            "gpu_xid",
            "An Xid critical-error event from NVML and its NVRM line in the kernel log.",
            _gpu_xid,
            params=(
                Param("xid", "the Xid number (79: fallen off the bus, 48: DBE, 13: graphics engine...)", minimum=1),
            ),
            demo=({"xid": 79}, {"xid": 95}, {"xid": 13}),
        ),
        _gpu_kind(
            "gpu_ecc_dbe",
            "An uncorrectable ECC error: counters, a DBE event, a row remap pending, Xid 48 in the log.",
            _gpu_ecc_dbe,
            demo=({},),
        ),
        _gpu_kind(
            "gpu_lost",
            "The GPU fell off the bus: Xid 79, then every NVML call for it fails.",
            _gpu_lost,
        ),
        _gpu_kind(
            "gpu_row_remap_failure",
            "Row remapping failed (no spare rows left): the GPU needs replacing; Xid 64 in the log.",
            _gpu_row_remap_failure,
            demo=({},),
        ),
        _gpu_kind(
            "gpu_nvlink_down",
            "One NVLink of the GPU goes down after a recovery attempt.",
            _gpu_nvlink_down,
            params=(Param("link", "which NVLink", default=0, maximum=H100_NVLINKS - 1),),
            demo=({"link": 3},),
        ),
        _gpu_kind(
            "gpu_thermal_slowdown",
            "Hardware thermal slowdown: the clock-event reasons say so and the SM clock drops.",
            _gpu_thermal_slowdown,
            demo=({},),
        ),
        FaultKind(
            "gpu_slow",
            "A fail-slow straggler: the GPU's clock, power and utilisation, and the node's traffic, scaled down.",
            _GPU,
            ("straggler",),
            params=(
                Param(
                    "factor",
                    "what is left of its speed",
                    integer=False,
                    default=0.7,
                    exclusive_minimum=True,
                    maximum=1,
                ),
            ),
            node=OnNode("gpu", _gpu_slow, _gpu_slow_clear),
            answered_by_effect=True,
        ),
        FaultKind(
            "nic_down",
            "The NIC's port goes down, and with it the switch port at the cable's other end.",
            _NIC,
            _NIC_INCIDENTS,
            node=OnNode("nic", _nic_down, _nic_up),
            cluster=OnCluster(_cut, _mend),
            demo=({},),
        ),
        FaultKind(
            "nic_flap",
            "The port went down and retrained ``count`` times (one-shot: it ends up).",
            _NIC,
            _NIC_INCIDENTS,
            params=(Param("count", "how many flaps", default=3, minimum=1),),
            node=OnNode("nic", _nic_flap, _one_shot),
            demo=({"count": 3},),
        ),
        FaultKind(
            "nic_errors",
            "A burst of physical-layer errors and the transport loss they cause (one-shot).",
            _NIC,
            _NIC_INCIDENTS,
            params=(
                Param("n", "symbol errors in the burst (the other counters follow from it)", default=1000, minimum=1),
            ),
            node=OnNode("nic", _nic_errors, _one_shot),
        ),
        FaultKind(
            "nic_degraded",
            "The port negotiated a lower rate (a lane down, a bad cable).",
            _NIC,
            _NIC_INCIDENTS,
            params=(
                Param("rate_gbps", "the rate it runs at, Gb/s", integer=False, default=200.0, exclusive_minimum=True),
            ),
            node=OnNode("nic", _nic_degraded, _nic_degraded_clear),
        ),
        FaultKind(
            "switch_down",
            "A dead switch: its agent goes silent and every cable's far end goes down.",
            frozenset({"switch"}),
            ("switch_fault",),
            cluster=OnCluster(_switch_down, _switch_up),
        ),
        FaultKind(
            "switch_port_down",
            "A switch port's link drops (a cable pulled, an optic dead): down at both ends.",
            frozenset({"port", "link"}),
            ("link_fault", "switch_fault", "nic_fault"),
            cluster=OnCluster(_cut, _mend),
        ),
        FaultKind(
            "pfc_storm",
            "Pause frames as fast as a NIC can send them, or a switch port's PFC watchdog seeing a storm.",
            frozenset({"nic", "port"}),
            ("nic_fault", "link_fault", "switch_fault"),
            params=(
                Param(
                    "queue",
                    "the lossless queue in storm (default: the first)",
                    default=None,
                    shapes=frozenset({"port"}),
                ),
            ),
            node=OnNode("nic", _nic_storm, _nic_storm_clear),
            cluster=OnCluster(_pfc_storm, _pfc_storm_clear),
        ),
        FaultKind(
            "optics_degraded",
            "The switch port's receive power falls below the low alarm (on a NIC: its switch port).",
            frozenset({"nic", "port"}),
            ("link_fault", "switch_fault"),
            cluster=OnCluster(_optics(True), _optics(False)),
        ),
        FaultKind(
            "node_down",
            "The machine dies: its agent stops; on clear a fresh agent starts on the same buffer.",
            frozenset({"node"}),
            ("node_down",),
            cluster=OnCluster(_node_down, _node_up),
        ),
        FaultKind(
            "partition",
            "The targets (nodes or switches) lose the controller while they keep running.",
            frozenset({"node", "switch"}),
            ("partition",),
            cluster=OnCluster(_partition, _partition_clear),
            many=True,
        ),
    ]
)
