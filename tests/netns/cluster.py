"""A small multi-rail fabric as network namespaces, running the real controller, agents and lldpd.

Layout (names from ``generate_fabric``: blocks of nodes, one leaf per rail and block)::

    ctl ── br-mgmt ──┬── d-leaf-b0-r0 ═ uplink ── leaf-b0-r0 [br-mgmt: m-node-000, m-node-001]
                     └── d-leaf-b1-r0 ═ uplink ── leaf-b1-r0 [br-mgmt: m-node-002, m-node-003]
    node-00N: mgmt0 (10.213.0.1N)  ens1f0np0 ═ leaf-bB-r0 EthernetS   ens2f0np0 ═ leaf-bB-r1 EthernetS

- ``ctl`` runs the controller (gRPC on 10.213.0.1) and a relay to it on a unix socket, the
  test's only way in (see relay.py).
- Every leaf host runs lldpd on its fabric ports, announcing the leaf's fabric name with
  port ids named as the switch ports (``Ethernet0``, ``Ethernet4``...).
- Every node host runs lldpd on its rail netdevs and the real agent with simulated GPUs and
  RDMA devices whose netdevs are the real veths (``--sim-real-netdevs``): a cable pulled at
  the leaf takes the NIC's port down, as on mlx5 hardware.
- The management network is bridged through each block's rail-0 leaf host: cutting that
  host's ``uplink`` cuts every node of the block from the controller.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from agent.sim.fake_kmsg import FakeKmsg
from agent.sim.node import SimNode, kmsg_pci
from controller.fabric import Fabric
from controller.fabric.generate import generate_fabric
from controller.fabric.io import save_fabric
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.netns.harness import Lab, Proc, run, tool, wait_until

REPO = Path(__file__).resolve().parents[2]
CTL = "ctl"
CTL_ADDR = "10.213.0.1"
GRPC_PORT = 50051
MGMT_BRIDGE = "br-mgmt"
HEARTBEAT_TIMEOUT_S = 3.0
AGENT_INTERVAL_S = 0.5


def rail_netdev(rail: int) -> str:
    """The fake sysfs tree's netdev for rail ``rail`` (FakeSysfs names them ens<rail+1>f0np0)."""
    return f"ens{rail + 1}f0np0"


@dataclass
class Cable:
    """One fabric cable: a node's rail NIC to a leaf port."""

    node: str
    rail: int
    leaf: str
    port: str

    @property
    def nic(self) -> str:
        return f"{self.node}/nic-{self.rail}"

    @property
    def netdev(self) -> str:
        return rail_netdev(self.rail)


@dataclass
class MultiHostCluster:
    """Builds the lab, starts everything, and answers questions through the controller's Query API."""

    lab: Lab
    nodes: int = 4
    rails: int = 2
    nodes_per_block: int = 2
    gpus: int = 2
    fabric: Fabric = field(init=False)
    cables: list[Cable] = field(default_factory=list)
    agents: dict[str, Proc] = field(default_factory=dict)
    lldpd: dict[str, Proc] = field(default_factory=dict)
    controller: Proc | None = None
    relay: Proc | None = None
    _kmsg: dict[str, FakeKmsg] = field(default_factory=dict)
    _gpu_pci: list[str] = field(default_factory=list)
    _channel: grpc.Channel | None = None
    _sockdir: Path | None = None
    _swaps: list[tuple[str, int, int]] = field(default_factory=list)
    _starts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fabric = generate_fabric(
            self.nodes, gpus_per_node=self.gpus, rails=self.rails, nodes_per_block=self.nodes_per_block, spines=1
        )
        for node in self.fabric.nodes():
            for nic in self.fabric.nics_of(node):
                leaf, port = self.fabric.leaf_of(nic), self.fabric.port_of(nic)
                assert leaf and port
                self.cables.append(Cable(node, self.fabric.rail_of(nic), leaf, port))

    # -- names --------------------------------------------------------------------------
    @property
    def node_ids(self) -> list[str]:
        return self.fabric.nodes()

    def mgmt_leaf(self, node: str) -> str:
        """The leaf host that carries ``node``'s management traffic (its block's rail-0 leaf)."""
        return next(c.leaf for c in self.cables if c.node == node and c.rail == 0)

    def node_address(self, node: str) -> str:
        return f"10.213.0.{10 + self.node_ids.index(node)}"

    def cable(self, node: str, rail: int) -> Cable:
        return next(c for c in self.cables if c.node == node and c.rail == rail)

    @property
    def workdir(self) -> Path:
        return self.lab.workdir

    def socket_dir(self) -> Path:
        """Control sockets and lldpd configs: a short path (unix sockets allow ~107 bytes) that
        the _lldpd user can traverse (lldpcli is setuid _lldpd on Debian; lldpd runs it to read
        its config and never resumes when it cannot)."""
        if self._sockdir is None:
            self._sockdir = Path(tempfile.mkdtemp(prefix=self.lab.prefix, dir="/tmp"))
            self._sockdir.chmod(0o755)
        return self._sockdir

    # -- building ------------------------------------------------------------------------
    def build(self) -> None:
        """Namespaces, cables, management bridges and addresses."""
        lab = self.lab
        lab.add_host(CTL)
        for leaf in self.fabric.leaves():
            lab.add_host(leaf)
        for node in self.node_ids:
            lab.add_host(node)
        for c in self.cables:
            lab.link(c.node, c.netdev, c.leaf, c.port)
        mgmt_leaves = sorted({self.mgmt_leaf(n) for n in self.node_ids})
        for leaf in mgmt_leaves:
            lab.link(leaf, "uplink", CTL, f"d-{leaf}")
            ports = ["uplink"]
            for node in self.node_ids:
                if self.mgmt_leaf(node) == leaf:
                    lab.link(node, "mgmt0", leaf, f"m-{node}")
                    ports.append(f"m-{node}")
            lab.bridge(leaf, MGMT_BRIDGE, ports)
        lab.bridge(CTL, MGMT_BRIDGE, [f"d-{leaf}" for leaf in mgmt_leaves])
        lab.address(CTL, MGMT_BRIDGE, CTL_ADDR)
        for node in self.node_ids:
            lab.address(node, "mgmt0", self.node_address(node))

    def _lldpd(self, host: str, interfaces: list[str], switch: bool) -> Proc:
        sock = self.socket_dir() / f"{host}.sock"
        conf = self.socket_dir() / f"lldpd-{host}.conf"
        lines = [f"configure system hostname {host}", "configure lldp tx-interval 1"]
        if switch:  # a switch names its ports by interface name (SONiC: Ethernet0)
            lines.append("configure lldp portidsubtype ifname")
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o644)
        argv = [tool("lldpd"), "-d", "-u", str(sock), "-O", str(conf), "-I", ",".join(interfaces)]
        proc = self.lab.spawn(host, f"lldpd-{host}", argv)
        self.lldpd[host] = proc
        return proc

    def lldp_socket(self, host: str) -> Path:
        return self.socket_dir() / f"{host}.sock"

    def start(self) -> None:
        """lldpd everywhere, the controller and its relay, then one agent per node."""
        for leaf in self.fabric.leaves():
            self._lldpd(leaf, sorted(c.port for c in self.cables if c.leaf == leaf), switch=True)
        for node in self.node_ids:
            self._lldpd(node, [rail_netdev(r) for r in range(self.rails)], switch=False)
        self._start_controller()
        for i, node in enumerate(self.node_ids):
            self._start_agent(node, seed=i)
        probe = SimNode("probe", self.workdir / "probe", gpus=self.gpus, nics=self.rails)
        self._gpu_pci = [kmsg_pci(probe.nvml.gpu(i).pci_bus_id) for i in range(self.gpus)]

    def _start_controller(self) -> None:
        fabric_path = self.workdir / "fabric.json"
        save_fabric(self.fabric, fabric_path)
        config = {
            "server": {
                "listen": f"{CTL_ADDR}:{GRPC_PORT}",
                "http": "127.0.0.1:18080",
                "db_path": str(self.workdir / "controller.db"),
                "grace_s": 0.5,
            },
            "ingest": {"heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S, "sweep_interval_s": 0.25},
            "fabric": {"path": str(fabric_path)},
            "detection": {
                "correlation": {
                    "settle_s": 0.5,
                    "partition_min_nodes": 2,
                    "partition_fleet_share": 0.6,
                    "resolve_hold_s": 1.0,
                }
            },
            "log": {"level": "info"},
        }
        path = self.workdir / "controller.yaml"
        path.write_text(yaml.safe_dump(config))
        self.controller = self.lab.spawn(
            CTL,
            "controller",
            [sys.executable, "-m", "starpulse.app.cli", "controller", "--config", str(path)],
            cwd=REPO,
        )
        self.relay = self.lab.spawn(
            CTL,
            "relay",
            [
                sys.executable,
                "-m",
                "tests.netns.relay",
                "--unix",
                str(self.query_socket),
                "--to",
                f"{CTL_ADDR}:{GRPC_PORT}",
            ],
            cwd=REPO,
        )

    @property
    def query_socket(self) -> Path:
        return self.socket_dir() / "controller-grpc.sock"

    def _start_agent(self, node: str, seed: int, interval_s: float = AGENT_INTERVAL_S) -> None:
        state = self.workdir / node
        argv = [
            sys.executable,
            "-m",
            "starpulse.app.cli",
            "agent",
            "--node-id",
            node,
            "--controller",
            f"{CTL_ADDR}:{GRPC_PORT}",
            "--backend",
            "sim",
            "--seed",
            str(seed),
            "--sim-gpus",
            str(self.gpus),
            "--sim-nics",
            str(self.rails),
            "--sim-real-netdevs",
            "--lldpcli-socket",
            str(self.lldp_socket(node)),
            "--lldp-interval-s",
            "0.5",
            "--interval-s",
            str(interval_s),
            "--state-dir",
            str(state),
        ]
        self._starts[node] = self._starts.get(node, 0) + 1
        self.agents[node] = self.lab.spawn(node, f"agent-{node}-{self._starts[node]}", argv, cwd=REPO)
        if node not in self._kmsg:  # one writer per node: its kernel-log seqs keep growing across restarts
            self._kmsg[node] = FakeKmsg(str(state / "sim" / "kmsg"))

    def restart_agent(self, node: str, interval_s: float = AGENT_INTERVAL_S) -> None:
        """Stop the node's agent (SIGTERM) and start it again on the same state folder (at ``interval_s``)."""
        old = self.agents.pop(node)
        self.lab.stop(old)
        self.lab.procs.remove(old)
        self._start_agent(node, seed=self.node_ids.index(node), interval_s=interval_s)

    # -- the controller's view -------------------------------------------------------------
    def query(self) -> sgrpc.QueryStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix:{self.query_socket}")
        return sgrpc.QueryStub(self._channel)

    def node_states(self) -> dict[str, str]:
        try:
            resp = self.query().ListNodes(spb.ListNodesRequest(), timeout=5)
        except grpc.RpcError:
            return {}
        return {n.node_id: n.state for n in resp.nodes}

    def events(self, node: str) -> list[Any]:
        resp = self.query().ListEvents(spb.ListEventsRequest(node_id=node, limit=10_000), timeout=10)
        return [e.event for e in resp.events]

    def incidents(self, include_resolved: bool = True) -> list[spb.IncidentInfo]:
        resp = self.query().ListIncidents(spb.ListIncidentsRequest(include_resolved=include_resolved), timeout=10)
        return list(resp.incidents)

    def topology(self) -> spb.TopologyResponse:
        return self.query().GetTopology(spb.TopologyRequest(), timeout=10)

    def lldp_neighbours(self, host: str) -> list[tuple[str, str, str]]:
        """(local interface, neighbour name, neighbour port) as that host's lldpd sees it."""
        res = run([tool("lldpcli"), "-u", str(self.lldp_socket(host)), "-f", "json", "show", "neighbors"], check=False)
        if res.returncode != 0:
            return []
        from agent.collectors.lldp import parse_lldpcli_json

        return [(n.local_interface, n.chassis_name, n.port_id) for n in parse_lldpcli_json(res.stdout)]

    def buffered_events(self, node: str) -> int:
        """Events in the agent's on-disk buffer (written, not yet acked by the controller)."""
        db = self.workdir / node / "agent-buffer.db"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            (count,) = conn.execute("SELECT COUNT(*) FROM events").fetchone()
        finally:
            conn.close()
        return int(count)

    # -- faults -----------------------------------------------------------------------------
    def xid(self, node: str, gpu: int, xid: int, note: str) -> int:
        """Write an NVRM Xid line into the node's kernel log; returns its kmsg seq."""
        rec = self._kmsg[node].xid(self._gpu_pci[gpu], xid, note)
        return int(rec.split(",")[1])

    def swap_cables_at_node(self, node: str, rail_a: int, rail_b: int) -> None:
        """Plug two of a node's cables into each other's NIC (a miswire after a repair); restore() undoes it.

        The veth that was rail_a's port becomes rail_b's netdev and back, so the RDMA device of
        rail_a now sits on the cable to rail_b's leaf. (Moving the switch end between leaf
        namespaces instead would leave lldpd there sending on the vanished interface.)
        """
        lab = self.lab
        a, b = rail_netdev(rail_a), rail_netdev(rail_b)
        for ifname in (a, b):
            lab.set_link(node, ifname, False)
        tmp = f"sw{secrets.token_hex(3)}"
        lab.ip(node, "link", "set", a, "name", tmp)
        lab.ip(node, "link", "set", b, "name", a)
        lab.ip(node, "link", "set", tmp, "name", b)
        for ifname in (a, b):
            lab.set_link(node, ifname, True)
        self._swaps.append((node, rail_a, rail_b))

    # -- health ------------------------------------------------------------------------------
    def diagnose(self) -> str:
        parts = []
        for proc in self.lab.procs:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} ({state})\n{proc.tail(15)}")
        return "\n".join(parts)

    def assert_processes_alive(self) -> None:
        dead = [p.name for p in self.lab.procs if not p.alive()]
        assert not dead, f"processes died: {dead}\n{self.diagnose()}"

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every node online and every cable confirmed by LLDP, with no miswire."""

        def ok() -> bool:
            self.assert_processes_alive()
            states = self.node_states()
            if sorted(states) != self.node_ids or set(states.values()) != {"online"}:
                return False
            topo = self.topology()
            return (
                topo.nodes_reporting_lldp == len(self.node_ids)
                and not topo.missing_links
                and not topo.miswired
                and not topo.unknown_devices
            )

        wait_until(ok, timeout, "all nodes online with their cables confirmed by LLDP", diagnose=self._why)

    def _why(self) -> str:
        try:
            topo = self.topology()
            view = {
                "states": self.node_states(),
                "lldp": topo.nodes_reporting_lldp,
                "missing": list(topo.missing_links),
                "miswired": list(topo.miswired),
                "unknown": list(topo.unknown_devices),
            }
        except grpc.RpcError as exc:
            view = {"query": str(exc)}
        return json.dumps(view, indent=1) + "\n" + self.diagnose()

    def restore(self) -> None:
        """Every cable and uplink up, no packet filter: the state each scenario starts from."""
        while self._swaps:
            node, rail_a, rail_b = self._swaps.pop()
            self.swap_cables_at_node(node, rail_a, rail_b)
            self._swaps.pop()
        for c in self.cables:
            self.lab.set_link(c.leaf, c.port, True)
            self.lab.set_link(c.node, c.netdev, True)
        for node in self.node_ids:
            self.lab.set_link(node, "mgmt0", True)
            self.lab.set_link(self.mgmt_leaf(node), f"m-{node}", True)
            self.lab.nft_flush(node)
        for leaf in {self.mgmt_leaf(n) for n in self.node_ids}:
            self.lab.set_link(leaf, "uplink", True)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        try:
            self.lab.close()
        finally:
            if self._sockdir is not None:
                shutil.rmtree(self._sockdir, ignore_errors=True)


def start_cluster(workdir: Path, timeout: float = 60.0) -> MultiHostCluster:
    """A built and started cluster, healthy; everything is torn down if starting fails."""
    cluster = MultiHostCluster(Lab(workdir))
    try:
        cluster.build()
        cluster.start()
        started = time.monotonic()
        cluster.wait_healthy(timeout)
        cluster.startup_s = time.monotonic() - started  # type: ignore[attr-defined]
    except BaseException:
        cluster.close()
        raise
    return cluster
