"""The demo's faults: what is injected where, at what pace, and when it clears.

Drawn (the default): every entry of the fault table that has demo parameters, on a node
that runs the job (the story is the job's), every ``LEAF_FAULT_EVERY``-th fault a leaf
switch going down instead, and, where the demo runs the probe mesh, the second of every
``PROBE_FAULT_EVERY`` a fault only probes see (``PROBE_DEMO``: a leaf dropping silently, a
leaf-spine cable losing or adding delay, on the data plane the agents' probes cross).
Scripted (a seeded run, a test): ``ScriptedFault`` entries in order. Either way a fault
clears by itself ``FAULT_LASTS_S`` after it began (a probe fault ``PROBE_FAULT_LASTS_S``),
unless a repair ended it first.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from agent.sim.probe_fabric import DataPlaneOnly, PlacedFault, SimProbeFabric
from agent.sim.repairs import SimRepairs
from controller.fabric import Fabric
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller

FAULT_EVERY_S = (25.0, 35.0)
"""Seconds between faults. A node is out ~10-30 s here (evicted 1-15 s after its fault, then
reset and validated in ~10 s; a reboot rung or a fault that outlasts its repair adds up to
its 20 s), so one node is out at a time, two when a slow one overlaps the next: what the
demo's guards allow (``starpulse.app.demo.demo_guards``)."""

FAULT_LASTS_S = 20.0
LEAF_FAULT_EVERY = 4
"""Every fourth drawn fault is a leaf switch going down: one switch incident, never an eviction."""

SWITCH_DOWN = "switch_down"

PROBE_FAULT_EVERY = 4
"""Of every four drawn faults the second acts on the data plane alone (where the mesh runs)."""

PROBE_FAULT_LASTS_S = 45.0
"""A probe fault lasts long enough to be named: the agents' 4 s windows, the localiser's 20 s
window filling with its evidence, two localisations 5 s apart (``starpulse.app.demo.demo_probes``)."""

PROBE_DEMO: dict[str, dict[str, object]] = {
    "switch_silent_drop": {"loss": 0.03},
    "link_loss": {"loss": 0.03},
    "link_delay": {"delay_ms": 2.0},
}
"""The probe mesh's fault kinds the demo draws, with its parameters. The fabric's own: no node is
taken out for them (a lossy NIC cable or a slow host would be evicted, and the node ladder's
reset or reboot does not mend a cable, so the repair could not validate)."""


def probe_menu() -> list[tuple[str, dict[str, object]]]:
    """The fault table's probe kinds the demo draws, in the table's order, with the demo's parameters."""
    return [(kind.name, dict(PROBE_DEMO[kind.name])) for kind in FAULTS if kind.probed and kind.name in PROBE_DEMO]


class ProbeFault:
    """A fault only probes see, on the demo's data plane, through the fault table's own action."""

    def __init__(self, plane: SimProbeFabric, kind: str, target: str, params: dict[str, object]) -> None:
        self.kind = kind
        self.target = target
        self._placed = PlacedFault(target, dict(params))
        self._surface = DataPlaneOnly(plane)

    @staticmethod
    def place(fabric: Fabric, kind: str, node: str, index: int) -> str:
        """Where a probe fault of ``kind`` goes for ``node``: the leaf of its NIC ``index``, or
        that leaf's cable to spine ``index`` (modulo the spines)."""
        nics = fabric.nics_of(node)
        leaf = fabric.leaf_of(nics[index % len(nics)])
        if leaf is None:
            raise ValueError(f"{node}'s NIC {index} is on no leaf")
        if kind == "switch_silent_drop":
            return leaf
        spines = sorted(fabric.spines_of(leaf))
        return fabric.link_name(leaf, spines[index % len(spines)])

    def describe(self) -> str:
        detail = " ".join(f"{k}={v}" for k, v in self._placed.params.items())
        return f"{self.kind} {detail} on {self.target} (no counter shows it: only the probe mesh)"

    def inject(self) -> None:
        FAULTS[self.kind].inject(self._surface, self._placed)

    def clear(self) -> None:
        FAULTS[self.kind].clear(self._surface, self._placed)


def fault_menu() -> list[tuple[str, str, dict[str, object]]]:
    """What the demo draws from: (kind, part, parameters) for each demo entry of the fault table, in its order."""
    return [(kind.name, kind.node.part, dict(params)) for kind in FAULTS if kind.node for params in kind.demo]


@dataclass(frozen=True)
class ScriptedFault:
    """One fault of a seeded run: a fault table kind on ``node`` (its part ``index``), or
    ``switch_down`` (a leaf; ``node``: one of the nodes it serves), or a probe kind of
    ``PROBE_DEMO`` (on the leaf of ``node``'s NIC ``index``, or that leaf's cable to spine
    ``index``; ``params`` over the demo's), ``after_s`` after the last."""

    kind: str
    node: str | None = None
    index: int = 0
    params: dict[str, object] = field(default_factory=dict)
    after_s: float = 25.0


class LeafFault:
    """A leaf switch going down in the demo: every NIC cabled to it loses its link at once.

    The demo has no switch agents; what the controller sees is what a dead leaf shows its
    hosts (their ends of its cables down, together), which the correlator must turn into
    one switch incident on the fabric, never an eviction of the nodes behind it."""

    def __init__(self, fabric: Fabric, sims: dict[str, SimNode], leaf: str) -> None:
        self.leaf = leaf
        self.ends = [
            (sims[node], fabric.rail_of(nic))
            for node in fabric.nodes()
            if node in sims
            for nic in fabric.nics_of(node)
            if fabric.leaf_of(nic) == leaf
        ]

    @classmethod
    def candidates(cls, fabric: Fabric, sims: dict[str, SimNode], node: str | None = None) -> list[LeafFault]:
        """Leaves that serve more than one node (the correlator blames a leaf on two at least),
        those of ``node`` when given, by name; a one-node fabric falls back to any leaf."""
        faults = [cls(fabric, sims, leaf) for leaf in fabric.leaves()]
        if node is not None:
            faults = [f for f in faults if any(sim.node_id == node for sim, _ in f.ends)] or faults
        return [f for f in faults if len({id(sim) for sim, _ in f.ends}) > 1] or faults

    def describe(self) -> str:
        n = len(self.ends)
        return f"{n} cable{'' if n == 1 else 's'} down at once"

    def inject(self) -> None:
        for sim, rail in self.ends:
            sim.port_down(rail)

    def clear(self) -> None:
        for sim, rail in self.ends:
            sim.port_up(rail)


def fault_targets(controller: Controller, scheduler: SimScheduler, sims: list[SimNode]) -> list[SimNode]:
    """Nodes a fault may hit next: in service, those running the job first (the story is the job's)."""
    healer = controller.healer
    in_service = [x for x in sims if healer is None or healer.store.state(x.node_id) == "in_service"]
    working = {n for job in scheduler.jobs.values() for n in job.nodes}
    return [x for x in in_service if x.node_id in working] or in_service or sims


class FaultPacer:
    """Injects the demo's faults at their pace, prints them, and clears them when they end."""

    def __init__(
        self,
        fabric: Fabric,
        sims: list[SimNode],
        repairs: dict[str, SimRepairs],
        controller: Controller,
        scheduler: SimScheduler,
        stamp: Callable[[], str],
        script: list[ScriptedFault] | None = None,
        seed: int = 7,
        first_after_s: float = 6.0,
        plane: SimProbeFabric | None = None,
    ) -> None:
        """``plane``: the data plane the agents' probes cross (None: no probe mesh, no probe faults)."""
        self.fabric = fabric
        self.plane = plane
        self.probe_menu = probe_menu() if plane is not None else []
        self.probe_faults = 0
        self.sims = sims
        self.by_id = {s.node_id: s for s in sims}
        self.repairs = repairs
        self.controller = controller
        self.scheduler = scheduler
        self.stamp = stamp
        self.script = script
        self.rng = random.Random(seed)
        self.menu = fault_menu()
        self.active: list[tuple[float, Any, str, str, dict[str, object]]] = []
        self.injected = 0
        self.leaf_faults = 0
        self.next_at = time.monotonic() + first_after_s

    @property
    def script_done(self) -> bool:
        return self.script is not None and self.injected >= len(self.script)

    def maybe_inject(self, now: float) -> None:
        """Inject the next fault when it is due."""
        if now < self.next_at or self.script_done:
            return
        if self.script is not None:
            planned = self.script[self.injected]
            self._inject(now, planned.kind, planned.node, planned.index, dict(planned.params))
            following = self.script[self.injected] if self.injected < len(self.script) else None
            self.next_at = now + (following.after_s if following is not None else 0.0)
            return
        if self.injected % LEAF_FAULT_EVERY == LEAF_FAULT_EVERY - 1:
            self._inject(now, SWITCH_DOWN, None, 0, {})
        elif self.probe_menu and self.injected % PROBE_FAULT_EVERY == 1:
            kind, params = self.rng.choice(self.probe_menu)
            sim = self.rng.choice(fault_targets(self.controller, self.scheduler, self.sims))
            self._inject(now, kind, sim.node_id, self.rng.randrange(8), params)
        else:
            kind, _, params = self.rng.choice(self.menu)
            sim = self.rng.choice(fault_targets(self.controller, self.scheduler, self.sims))
            self._inject(now, kind, sim.node_id, self.rng.randrange(8), params)
        self.next_at = now + self.rng.uniform(*FAULT_EVERY_S)

    def _inject(self, now: float, kind: str, node: str | None, index: int, params: dict[str, object]) -> None:
        self.injected += 1
        if kind == SWITCH_DOWN:
            leaf = self.rng.choice(LeafFault.candidates(self.fabric, self.by_id, node))
            print(f"{self.stamp()} inject switch_down on {leaf.leaf} ({leaf.describe()})", flush=True)
            leaf.inject()
            self.leaf_faults += 1
            self.active.append((now + FAULT_LASTS_S, leaf, SWITCH_DOWN, leaf.leaf, {}))
            return
        if kind in PROBE_DEMO:
            if self.plane is None:
                raise ValueError(f"{kind} needs the probe mesh's data plane")
            node = node if node is not None else self.rng.choice(self.sims).node_id
            params = {**PROBE_DEMO[kind], **params}
            fault = ProbeFault(self.plane, kind, ProbeFault.place(self.fabric, kind, node, index), params)
            print(f"{self.stamp()} inject {fault.describe()}", flush=True)
            fault.inject()
            self.probe_faults += 1
            self.active.append((now + PROBE_FAULT_LASTS_S, fault, kind, fault.target, params))
            return
        part = next(p for k, p, _ in self.menu if k == kind)
        sim = self.by_id[node] if node is not None else self.rng.choice(self.sims)
        component = f"{part}-{index}"
        detail = " ".join(f"{k}={v}" for k, v in params.items())
        print(f"{self.stamp()} inject {kind} {detail} on {sim.node_id}/{component}", flush=True)
        self.repairs[sim.node_id].inject(kind, component, **params)
        self.active.append((now + FAULT_LASTS_S, sim, kind, component, params))

    def clear_due(self, now: float) -> None:
        """End the faults whose time is up (those a repair ended already are skipped)."""
        for item in [a for a in self.active if a[0] <= now]:
            self.active.remove(item)
            _, what, kind, component, params = item
            if isinstance(what, LeafFault):
                what.clear()
                print(f"{self.stamp()} clear switch_down on {what.leaf}", flush=True)
            elif isinstance(what, ProbeFault):
                what.clear()
                print(f"{self.stamp()} clear {kind} on {component}", flush=True)
            elif self.repairs[what.node_id].clear(kind, component, **params):
                print(f"{self.stamp()} clear {kind} on {what.node_id}/{component}", flush=True)
