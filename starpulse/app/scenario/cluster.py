"""A whole simulated cluster in one process: a real agent per node and per switch, faults by scenario kind.

Every compute node (spares included) runs the real Agent over a SimNode (fake NVML,
sysfs, kernel log) plus an LldpCollector fed lldpcli JSON rendered from the fabric;
every leaf and spine runs a switch-role Agent whose SonicSwitchCollector reads a
FakeSwitch in its own in-process fakeredis server (no redis-server per switch). All
agents stream to ``controller_target`` over real gRPC, as tasks in the caller's loop.

Faults act where the hardware would show them. A cable is modelled by its ends (a NIC,
a switch port): taking it down downs every end it has, each end is down while any fault
holds it, so overlapping faults (a NIC down inside a dead leaf) clear correctly. A dead
switch goes silent and its *peers* see their ends go down; its own tables are left
alone, since a dead switch reports nothing about itself.

Probes cross a simulated data plane (``SimProbeFabric``): every node's agent takes the
controller's probe plan on its stream and reports each window's results in its reports, drawn
per flow from the data plane (``DrawnProber``: the spine its ECMP hash picks, its probes lost
or delayed by the faults on its path). The probe mesh's fault kinds (silent drop, a lossy or
slow cable, a slow host, a lossy NIC cable) act there alone: no counter or port state shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fakeredis
import redis
import structlog

from agent.factory import build_agent, build_switch_agent
from agent.runtime import Agent, AgentConfig
from agent.sim.fake_switch import FakeSwitch
from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from agent.sim.probe_fabric import DrawnProber, SimProbeFabric
from controller.fabric import Fabric
from starpulse.app.scenario.spec import FaultSpec, Scenario, switch_port, switch_port_count, target_kind
from starpulse.v1 import inventory_pb2 as ipb

log = structlog.get_logger(__name__)

# Queues per switch port: the two lossless ones (3, 4) and the best-effort ones below them. Every
# queue is a Redis hash written and read each cycle, so eight would cost 40% more CPU for nothing.
SWITCH_QUEUES = 5
# A cable end: a NIC ("node-003/nic-5") or a switch port (("leaf-b0-r5", "Ethernet12")).
End = str | tuple[str, str]
FaultKey = tuple[str, str, tuple[str, ...], float]


def fault_key(fault: FaultSpec) -> FaultKey:
    """What identifies a fault between inject and clear (an equal re-parsed fault clears it too)."""
    return (fault.kind, fault.target, tuple(fault.targets), fault.at_s)


class _Holds:
    """Reference counts of who holds what down: the first hold applies, the last release undoes."""

    def __init__(self) -> None:
        self._held: dict[Any, set[FaultKey]] = {}

    def acquire(self, what: Any, by: FaultKey) -> bool:
        holders = self._held.setdefault(what, set())
        first = not holders
        holders.add(by)
        return first

    def release(self, what: Any, by: FaultKey) -> bool:
        holders = self._held.get(what)
        if not holders or by not in holders:
            return False
        holders.discard(by)
        if not holders:
            del self._held[what]
            return True
        return False

    def held(self, what: Any) -> bool:
        return bool(self._held.get(what))


@dataclass
class _Member:
    """One agent of the cluster: how to (re)build it, and its running task."""

    name: str
    build: Callable[[], Agent]
    agent: Agent
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class _FakeRedisFactory:
    """One fakeredis server per switch; one cached client per DB (FakeSwitch asks on every write)."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()
        self._clients: dict[int, redis.Redis] = {}

    def __call__(self, db: int) -> redis.Redis:
        client = self._clients.get(db)
        if client is None:
            # bytes replies: the collector decodes either way, and fakeredis is ~2x cheaper without
            client = fakeredis.FakeRedis(server=self.server, db=db, decode_responses=False)
            self._clients[db] = client
        return client

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            with contextlib.suppress(Exception):
                client.close()


# SONiC itself refreshes queue counters every 10 s and port counters every 1 s; the
# simulated switches move their counters in steps of this many seconds (faults such as a
# port going down are written at once, not on this clock). It keeps dozens of switches
# within one process's CPU budget.
SWITCH_COUNTER_STEP_S = 5.0


class _LockedSwitch:
    """Serialises a FakeSwitch between the agent's worker thread (advance) and fault injection."""

    def __init__(self, switch: FakeSwitch) -> None:
        self.switch = switch
        self.lock = threading.Lock()
        self._pending_s = 0.0

    def advance(self, dt_s: float) -> None:
        self._pending_s += max(dt_s, 0.0)
        if self._pending_s < SWITCH_COUNTER_STEP_S:
            return
        with self.lock:
            self.switch.advance(self._pending_s)
        self._pending_s = 0.0


def render_lldpcli_json(neighbours: Sequence[tuple[str, str, str]]) -> str:
    """``lldpcli -f json show neighbors`` text for (local interface, switch name, switch port) triples."""
    interfaces = [
        {
            ifname: {
                "via": "LLDP",
                "chassis": {
                    system: {
                        "id": {"type": "local", "value": system},
                        "descr": "SONiC Software Version: starpulse-sim",
                    }
                },
                "port": {"id": {"type": "local", "value": port}, "descr": port},
            }
        }
        for ifname, system, port in neighbours
    ]
    return json.dumps({"lldp": {"interface": interfaces}})


class SimCluster:
    """A compute agent per node (spares too) and a switch agent per leaf and spine, in the caller's loop.

    ``inject``/``clear`` take scenario faults; they act at once on the simulated hardware
    (the agents notice on their next cycle) and return without waiting.
    """

    def __init__(
        self,
        scenario_or_fabric: Scenario | Fabric,
        workdir: str | Path,
        controller_target: str,
        interval_s: float | None = None,
        *,
        lldp_interval_s: float | None = None,
        keep_files: bool = False,
        probe_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``probe_clock``: when the agents' probe windows close (the controller's fake clock in a
        test that drives it; the agents themselves report on real time)."""
        if isinstance(scenario_or_fabric, Scenario):
            self.scenario: Scenario | None = scenario_or_fabric
            self.fabric = scenario_or_fabric.build_fabric()
            default_interval = scenario_or_fabric.interval_s
        else:
            self.scenario = None
            self.fabric = scenario_or_fabric
            default_interval = 0.5
        self.interval_s = float(interval_s if interval_s is not None else default_interval)
        self.lldp_interval_s = float(lldp_interval_s if lldp_interval_s is not None else self.interval_s)
        self.controller_target = controller_target
        self.root = Path(workdir) / "simcluster"
        self.keep_files = keep_files
        self._probe_clock = probe_clock
        self.agents: dict[str, Agent] = {}
        self.sims: dict[str, SimNode] = {}
        self.switches: dict[str, FakeSwitch] = {}
        self._locked: dict[str, _LockedSwitch] = {}
        self._redis: dict[str, _FakeRedisFactory] = {}
        self._members: dict[str, _Member] = {}
        self._holds = _Holds()
        self.data_plane = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of)
        self._pending: set[asyncio.Task[None]] = set()
        self._started = False
        self._stopped = False
        gpus = int(self.fabric.params.get("gpus_per_node", 8))
        # End and link indexes: which cable is on which switch port, and which NIC is on it.
        self._nic_index: dict[str, int] = {}
        self._nic_end: dict[str, tuple[str, str]] = {}  # nic -> (leaf, port)
        self._peer_end: dict[tuple[str, str], End] = {}  # switch port -> the other end of its cable
        self.root.mkdir(parents=True, exist_ok=True)
        for i, node in enumerate(self.fabric.nodes()):
            nics = self.fabric.nics_of(node)
            vendor = self.scenario.vendor_of(node) if self.scenario is not None else "nvidia"
            self.sims[node] = SimNode(node, self.root / node / "hw", gpus=gpus, nics=len(nics), seed=i, vendor=vendor)
            for nic in nics:
                self._nic_index[nic] = self.fabric.rail_of(nic)
                leaf, port = self.fabric.leaf_of(nic), self.fabric.port_of(nic)
                if leaf is not None and port is not None:
                    self._nic_end[nic] = (leaf, port)
                    self._peer_end[(leaf, port)] = nic
        for leaf in self.fabric.leaves():
            for spine in self.fabric.spines_of(leaf):
                attrs = self.fabric.graph.edges[leaf, spine]
                a, b = (leaf, str(attrs["leaf_port"])), (spine, str(attrs["spine_port"]))
                self._peer_end[a], self._peer_end[b] = b, a
        for switch in self.fabric.switches():
            self._build_switch(switch)
        for node in self.fabric.nodes():
            self._add_member(node, lambda n=node: self._build_node_agent(n))  # type: ignore[misc]
        for switch in self.fabric.switches():
            self._add_member(switch, lambda s=switch: self._build_switch_agent(s))  # type: ignore[misc]

    # -- building ----------------------------------------------------------------------------

    def _config(self, name: str, role: int) -> AgentConfig:
        # Switch agents report at most once a second (a SONiC switch's own port poll is 1 s).
        interval = self.interval_s if role == ipb.NODE_ROLE_COMPUTE else max(self.interval_s, 1.0)
        return AgentConfig(
            node_id=name,
            controllers=[self.controller_target],
            role=role,
            interval_s=interval,
            buffer_path=str(self.root / name / "buffer.db"),
        )

    def _build_node_agent(self, node: str) -> Agent:
        """The factory's sim agent, its LLDP fed from the fabric (what lldpd on the node would print)."""
        return build_agent(
            self._config(node, ipb.NODE_ROLE_COMPUTE),
            "sim",
            # its probe windows: idle until the controller plans a mesh
            prober=DrawnProber(self.data_plane, seed=self._seed(node), now=self._probe_clock),
            sim=self.sims[node],
            lldp_runner=lambda _argv: self._lldp_json(node),
            lldp_interval_s=self.lldp_interval_s,
        )

    def _seed(self, node: str) -> int:
        return self.fabric.nodes().index(node)

    def _build_switch(self, switch: str) -> None:
        factory = _FakeRedisFactory()
        fake = FakeSwitch(factory, switch, ports=switch_port_count(self.fabric, switch), queues=SWITCH_QUEUES)
        fake.install()
        self._redis[switch] = factory
        self.switches[switch] = fake
        self._locked[switch] = _LockedSwitch(fake)
        for port in fake.ports:
            self._set_switch_lldp(switch, port, up=True)

    def _build_switch_agent(self, switch: str) -> Agent:
        return build_switch_agent(
            self._config(switch, ipb.NODE_ROLE_SWITCH), self._redis[switch], before_collect=self._locked[switch].advance
        )

    def _add_member(self, name: str, build: Callable[[], Agent]) -> None:
        member = _Member(name=name, build=build, agent=build())
        self._tune(member.agent)
        self._members[name] = member
        self.agents[name] = member.agent

    @staticmethod
    def _tune(agent: Agent) -> None:
        # Reconnect fast after a partition or controller restart: a scenario is seconds long.
        agent.link.backoff.initial_s = 0.2
        agent.link.backoff.max_s = 2.0

    # -- LLDP ----------------------------------------------------------------------------------

    def _lldp_json(self, node: str) -> str:
        """What lldpd on ``node`` would print: one neighbour per NIC whose cable is up."""
        netdevs = self.sims[node].sysfs.netdevs()
        triples: list[tuple[str, str, str]] = []
        for nic in self.fabric.nics_of(node):
            end = self._nic_end.get(nic)
            i = self._nic_index[nic]
            if end is None or self._holds.held(nic) or i >= len(netdevs):
                continue
            triples.append((netdevs[i], end[0], end[1]))
        return render_lldpcli_json(triples)

    def _set_switch_lldp(self, switch: str, port: str, up: bool) -> None:
        """The switch's lldpd entry for ``port``: the NIC's host and netdev, or the other switch's port."""
        fake = self.switches[switch]
        peer = self._peer_end.get((switch, port))
        if peer is None:
            return
        if not up:
            fake.clear_lldp_neighbor(port)
        elif isinstance(peer, str):
            host = self.fabric.host_of(peer)
            netdev = self.sims[host].sysfs.netdevs()[self._nic_index[peer]]
            fake.set_lldp_neighbor(port, host, netdev)
        else:
            fake.set_lldp_neighbor(port, peer[0], peer[1])

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every agent as a task in the running loop."""
        if self._started:
            return
        self._started = True
        for member in self._members.values():
            self._run_member(member)
        log.info(
            "simcluster_started",
            nodes=len(self.sims),
            switches=len(self.switches),
            interval_s=self.interval_s,
            target=self.controller_target,
        )

    def _run_member(self, member: _Member) -> None:
        member.stop = asyncio.Event()
        member.task = asyncio.create_task(member.agent.run(member.stop), name=f"agent:{member.name}")

    async def stop(self) -> None:
        """Stop every agent (unsent events stay in their buffers), close the fake Redis servers. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for member in self._members.values():
            member.stop.set()
        tasks = [m.task for m in self._members.values() if m.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        for factory in self._redis.values():
            factory.close()
        if not self.keep_files:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
        log.info("simcluster_stopped", agents=len(tasks))

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def jobs_of(self, node: str) -> list[str]:
        """Jobs on ``node`` (the scenario's rule: a job of K nodes takes the first K non-spare nodes)."""
        return self.scenario.jobs_of(node) if self.scenario is not None else []

    def running(self, name: str) -> bool:
        """Whether ``name``'s agent task is running (False while node_down holds it)."""
        task = self._members[name].task
        return task is not None and not task.done()

    # -- cable ends ------------------------------------------------------------------------------

    def _ends_of_link(self, link: str) -> list[End]:
        a, b = Fabric.link_ends(link)
        if self.fabric.kind(a) == "nic" or self.fabric.kind(b) == "nic":
            nic = a if self.fabric.kind(a) == "nic" else b
            return [nic, self._nic_end[nic]]
        leaf, spine = (a, b) if self.fabric.kind(a) == "leaf" else (b, a)
        attrs = self.fabric.graph.edges[leaf, spine]
        return [(leaf, str(attrs["leaf_port"])), (spine, str(attrs["spine_port"]))]

    def _ends_of_port(self, switch: str, port: str) -> list[End]:
        """A switch port and, when cabled, the other end of its cable (a link is down at both ends)."""
        peer = self._peer_end.get((switch, port))
        return [(switch, port)] if peer is None else [(switch, port), peer]

    def _cable_ends(self, target: str) -> list[End]:
        """The ends a fault on ``target`` takes down: a NIC and its switch port, a port and its far end,
        both ends of a cable, or the far end of every cable of a (dead) switch."""
        shape = target_kind(self.fabric, target)
        if shape == "nic":
            end = self._nic_end.get(target)
            return [target] if end is None else [target, end]
        if shape == "switch":
            return [peer for p in self.switches[target].ports if (peer := self._peer_end.get((target, p))) is not None]
        if shape == "port":
            return self._ends_of_port(*switch_port(self.fabric, target))
        if shape == "link":
            return self._ends_of_link(target)
        raise ValueError(f"{target!r} ({shape}) has no cables of its own")

    def _hold_end(self, end: End, by: FaultKey) -> None:
        if not self._holds.acquire(end, by):
            return
        if isinstance(end, str):
            self.sims[self.fabric.host_of(end)].port_down(self._nic_index[end])
        else:
            switch, port = end
            with self._locked[switch].lock:
                self.switches[switch].port_down(port)
                self._set_switch_lldp(switch, port, up=False)

    def _release_end(self, end: End, by: FaultKey) -> None:
        if not self._holds.release(end, by):
            return
        if isinstance(end, str):
            self.sims[self.fabric.host_of(end)].port_up(self._nic_index[end])  # a storm or lower rate held stays
        else:
            switch, port = end
            with self._locked[switch].lock:
                self.switches[switch].port_up(port)
                self._set_switch_lldp(switch, port, up=True)

    # -- agents: silence, stop, restart -----------------------------------------------------------

    def _block(self, name: str, by: FaultKey) -> None:
        if self._holds.acquire(("blocked", name), by):
            self._members[name].agent.link.set_blocked(True)

    def _unblock(self, name: str, by: FaultKey) -> None:
        if self._holds.release(("blocked", name), by):
            self._members[name].agent.link.set_blocked(False)

    def _halt(self, name: str, by: FaultKey) -> None:
        if self._holds.acquire(("down", name), by):
            self._members[name].stop.set()

    def _revive(self, name: str, by: FaultKey) -> None:
        if self._holds.release(("down", name), by):
            task = asyncio.get_running_loop().create_task(self._restart(name), name=f"restart:{name}")
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _restart(self, name: str) -> None:
        """A node coming back: a fresh agent on the same buffer file (its events resume, none lost)."""
        member = self._members[name]
        if member.task is not None:
            await asyncio.gather(member.task, return_exceptions=True)
        if self._stopped or self._holds.held(("down", name)):
            return
        member.agent = await asyncio.to_thread(member.build)
        member.stop = asyncio.Event()  # the fresh agent has not been told to stop
        self._tune(member.agent)
        self.agents[name] = member.agent
        if self._holds.held(("blocked", name)):
            member.agent.link.set_blocked(True)
        if self._started:
            self._run_member(member)
        log.info("simcluster_agent_restarted", agent=name)

    # -- faults: what each kind does is the simulator's fault table; this is the fabric it acts on ---

    def inject(self, fault: FaultSpec) -> None:
        """Start a scenario fault now (call from the loop the agents run in)."""
        log.info("simcluster_inject", kind=fault.kind, target=fault.target or fault.targets, **fault.params)
        FAULTS[fault.kind].inject(_FaultScope(self, fault_key(fault)), fault)

    def clear(self, fault: FaultSpec) -> None:
        """End a fault started by ``inject`` (a scenario's until_s); other faults keep their hold."""
        log.info("simcluster_clear", kind=fault.kind, target=fault.target or fault.targets)
        FAULTS[fault.kind].clear(_FaultScope(self, fault_key(fault)), fault)

    # -- measurement ---------------------------------------------------------------------------

    def cycles(self) -> int:
        """Collection cycles run by every current agent (to check the cluster keeps up)."""
        return sum(a.cycles for a in self.agents.values())


class _FaultScope:
    """The cluster as one fault sees it (agent.sim.faults.ClusterSurface): every hold is in its name."""

    def __init__(self, cluster: SimCluster, key: FaultKey) -> None:
        self._c = cluster
        self._key = key

    def shape(self, target: str) -> str:
        return target_kind(self._c.fabric, target)

    def node(self, target: str) -> SimNode:
        return self._c.sims[target.partition("/")[0]]

    def cut_cables(self, target: str) -> None:
        for end in self._c._cable_ends(target):
            self._c._hold_end(end, self._key)

    def mend_cables(self, target: str) -> None:
        for end in self._c._cable_ends(target):
            self._c._release_end(end, self._key)

    def hold(self, what: Hashable) -> bool:
        return self._c._holds.acquire(what, self._key)

    def release(self, what: Hashable) -> bool:
        return self._c._holds.release(what, self._key)

    def silence(self, name: str) -> None:
        self._c._block(name, self._key)

    def unsilence(self, name: str) -> None:
        self._c._unblock(name, self._key)

    def halt(self, name: str) -> None:
        self._c._halt(name, self._key)

    def revive(self, name: str) -> None:
        self._c._revive(name, self._key)

    def switch_port(self, target: str) -> tuple[str, str]:
        if self.shape(target) == "port":
            return switch_port(self._c.fabric, target)
        end = self._c._nic_end.get(target)
        if end is None:
            raise ValueError(f"{target} is not cabled to a switch")
        return end

    def data_plane(self) -> SimProbeFabric:
        return self._c.data_plane

    @contextlib.contextmanager
    def switch(self, name: str) -> Iterator[FakeSwitch]:
        with self._c._locked[name].lock:
            yield self._c.switches[name]
