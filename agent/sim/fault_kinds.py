"""What a fault kind is: whom it targets, its typed parameters, and what it does to the fakes.

A ``FaultKind`` says whom it targets (a GPU, a NIC, a node, a switch, a switch port, a
cable), its parameters with their defaults and bounds, which incident kinds answer it,
and its inject and clear: on one part of one simulated node (``SimParts``: fake NVML,
sysfs and kernel log) and, where the fabric is involved, through the simulated cluster
(cable ends, switches, agents), which it reaches through the small ``ClusterSurface``
protocol rather than by knowing the cluster. ``FaultTable`` is the registry type; the
one table of every kind is ``agent.sim.faults.FAULTS``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from starpulse.core import vocab

if TYPE_CHECKING:
    from agent.sim.fake_switch import FakeSwitch
    from agent.sim.parts import SimParts
    from agent.sim.probe_fabric import SimProbeFabric

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

    def node(self, target: str) -> SimParts:
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

    def data_plane(self) -> SimProbeFabric:
        """The cluster's simulated rail data plane: what the agents' probes cross (the probe mesh's faults)."""
        ...


NodeAction = Callable[["SimParts", int, Params], None]
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
    ``probed``: it acts on the simulated data plane alone, so only the probe mesh can see it.
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
    vendor: str | None = None  # the accelerator vendor its GPU must be (None: any; GPU kinds: "nvidia")
    probed: bool = False  # only the probe mesh sees it (no counter, no port state): a scenario turns probing on

    @property
    def needs_vendor(self) -> str | None:
        """Whose GPU this kind acts on: its ``vendor``, NVIDIA for the other GPU kinds, None otherwise."""
        if self.vendor is not None:
            return self.vendor
        return "nvidia" if self.node is not None and self.node.part == "gpu" else None

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
